#!/usr/bin/env python3
"""Real workloads, each untraced, under leaktracer (default options, --heap sampled, --heap full)
and under the peers (memray for Python, heaptrack for all), in one run: wall time and its ratio
to untraced, leaktracer's own peak memory, records lost, and whether the leak was found at the
line marked LEAK-SITE in the program's source. Run through scripts/bench-workloads.sh, which
installs what it needs. Environment: LT (the leaktracer binary), PEERS (memray's directory),
QUICK=1 (smaller workloads), ONLY (a substring of the workloads' names to run), PEER_TIMEOUT (the
seconds a peer may run, 300 by default: heaptrack did not finish the job with DataLoader workers
in eight minutes here), LONG=EPOCHS (adds a long training job, EPOCHS epochs of which one in 20
keeps its leak, untraced and under the default alone: some 16 epochs a second here, so 30000 is
half an hour)."""

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "tests/fixtures/bench"
FIXTURES = ROOT / "tests/fixtures/python"
LT = os.environ.get("LT", str(ROOT / "target/release/leaktracer"))
PEERS = os.environ.get("PEERS", str(ROOT / ".peers"))
QUICK = os.environ.get("QUICK") == "1"
ONLY = os.environ.get("ONLY", "")
PY = sys.executable
# How long a peer may take (heaptrack did not finish the job with DataLoader workers).
PEER_TIMEOUT = int(os.environ.get("PEER_TIMEOUT", "300"))
# transformers and its dependencies are in .pydeps-hf, Lightning's in .pydeps-pl
# (scripts/setup.sh); read offline.
PY_ENV = {**os.environ,
          "PYTHONPATH": f"{ROOT / '.pydeps'}:{ROOT / '.pydeps-hf'}:{ROOT / '.pydeps-pl'}",
          "HF_HUB_OFFLINE": "1"}
# The counters of records the tracer lost (the rest of `losses` are unmatched frees and such).
LOST = (
    "ringbuf_full",
    "pending_full",
    "traced_full",
    "stack_errors",
    "return_without_entry",
    "stack_table_full",
    "undecodable",
    "stop_failed",
    "sampled_full",
)


def leak_site(source):
    """"name:line" of the LEAK-SITE mark in `source`; none for a workload without a leak."""
    if source is None:
        return None
    for n, text in enumerate(source.read_text().splitlines(), 1):
        if "LEAK-SITE" in text:
            return f"{source.name}:{n}"
    raise SystemExit(f"no LEAK-SITE in {source}")


def workloads(build):
    cpp = build / "alloc_heavy"
    src = BENCH / "alloc_heavy.cpp"
    if not cpp.exists() or cpp.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["g++", "-O2", "-g", "-o", str(cpp), str(src)], check=True)
    epochs, requests, lines = ("10", "100000", "300000") if QUICK else ("200", "600000", "1500000")
    return [
        ("CPU PyTorch training", "python", [PY, str(BENCH / "torch_train.py"), epochs],
         BENCH / "torch_train.py"),
        # The same job without its leak: nothing to find, and what tracing costs a correct one.
        ("CPU PyTorch training, no leak", "python",
         [PY, str(BENCH / "torch_train.py"), epochs, "fixed"], None),
        # Each step's loss kept: its autograd graph's nodes, malloc'd, not tensors.
        ("CPU PyTorch training, losses kept", "python",
         [PY, str(BENCH / "loss_history.py"), "10" if QUICK else "100"],
         BENCH / "loss_history.py"),
        # A Dataset whose two DataLoader workers keep every sample they decode: a leak in the
        # job's forked children, of numpy arrays (malloc), not tensors.
        ("CPU PyTorch training, DataLoader workers keep samples", "python",
         [PY, str(FIXTURES / "worker_cache.py"), "4" if QUICK else "12"],
         FIXTURES / "worker_cache.py"),
        # The same leak in a long loop: the malloc family traced, its leak confirmed, taken out.
        ("CPU PyTorch loop, losses kept, long", "python",
         [PY, str(BENCH / "loss_steps.py"), "10000" if QUICK else "100000"],
         BENCH / "loss_steps.py"),
        # A transformer on sequences of varying length, each step's loss kept; and without.
        ("CPU PyTorch transformer, losses kept", "python",
         [PY, str(BENCH / "tx_train.py"), "150" if QUICK else "600"], BENCH / "tx_train.py"),
        ("CPU PyTorch transformer, no leak", "python",
         [PY, str(BENCH / "tx_train.py"), "150" if QUICK else "600", "fixed"], None),
        # A Hugging Face Trainer job (transformers' own training loop) whose compute_loss keeps
        # each step's last hidden state with its graph; and one that keeps a float of it.
        ("Hugging Face Trainer (PyTorch), hidden states kept", "python",
         [PY, str(FIXTURES / "hf_trainer.py"), "100" if QUICK else "600"],
         FIXTURES / "hf_trainer.py"),
        ("Hugging Face Trainer (PyTorch), no leak", "python",
         [PY, str(FIXTURES / "hf_trainer.py"), "100" if QUICK else "600", "fixed"], None),
        # A Lightning job (Lightning's own Trainer) whose training_step keeps each step's loss,
        # its graph's nodes malloc'd by the forward line; and one that keeps its value.
        ("Lightning (PyTorch), losses kept", "python",
         [PY, str(FIXTURES / "pl_train.py"), "20" if QUICK else "150"], FIXTURES / "pl_train.py"),
        ("Lightning (PyTorch), no leak", "python",
         [PY, str(FIXTURES / "pl_train.py"), "20" if QUICK else "150", "fixed"], None),
        ("pure-Python service", "python", [PY, str(BENCH / "py_service.py"), requests],
         BENCH / "py_service.py"),
        ("C++ allocation-heavy (-O2)", "native", [str(cpp), lines], src),
    ] + long_job()


def long_job():
    """The long training job (LONG=EPOCHS), where asked for."""
    epochs = os.environ.get("LONG")
    if not epochs:
        return []
    name = f"CPU PyTorch training, long ({epochs} epochs, 1 in 20 kept)"
    return [(name, "python", [PY, str(BENCH / "torch_train.py"), epochs, "20"],
             BENCH / "torch_train.py")]


def settle():
    """A finished leaktracer detaches its uprobes in the background; until then every malloc on
    the machine still traps. Each measurement waits for that."""
    while subprocess.run(["pgrep", "-x", "leaktracer"], capture_output=True).returncode == 0:
        time.sleep(0.2)


def timed(argv, env, timeout=None):
    """Wall seconds and the finished process; None for the process when it ran past `timeout`
    (it and its process group are killed: a DataLoader's workers outlive their parent)."""
    settle()
    t = time.monotonic()
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, text=True, start_new_session=True) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            return time.monotonic() - t, None
    return time.monotonic() - t, subprocess.CompletedProcess(argv, p.returncode, out, err)


def keep_wrong(report):
    """Keeps the report of a run that missed its leak or printed one where there is none, for
    its stacks to be read later; returns where."""
    keep = ROOT / "target/bench-wrong"
    keep.mkdir(parents=True, exist_ok=True)
    path = keep / f"{time.strftime('%Y%m%dT%H%M%S')}.json"
    shutil.copy(report, path)
    return path.relative_to(ROOT)


def leaktracer(argv, env, flags, site, tmp):
    out = Path(tmp) / "report.json"
    cmd = [LT, "check", "--no-store", "--json", "-o", str(out), *flags, "--", *argv]
    wall, p = timed(cmd, env)
    if p.returncode not in (0, 1):
        return wall, {"note": f"exit {p.returncode}: {p.stderr.strip()[-200:]}"}
    loop = loop_s(p.stdout)
    r = json.loads(out.read_text())
    leak = next((l for l in p.stdout.splitlines() if l.strip().startswith("LEAK ")), "")
    found = leak.rsplit(": ", 1)[-1] if leak else "-"
    right = found.endswith(f"({site})") if site else found == "-"
    if not site:
        found = "none printed" if right else f"printed {found}"
    if not right:
        found += f" (report kept: {keep_wrong(out)})"
    return wall, {
        "rss": r.get("tracer_peak_rss_bytes", 0),
        "lost": sum(r["losses"].get(k, 0) for k in LOST),
        "unmatched": r["losses"].get("unmatched_frees", 0),
        "tensors": any(p.get("tensors") for p in r.get("processes", [])),
        "found": found,
        "right": right,
        "loop": loop,
    }


def memray(argv, env, site, tmp):
    out = Path(tmp) / "memray.bin"
    env = {**env, "PYTHONPATH": f"{PEERS}:{env.get('PYTHONPATH', '')}"}
    wall, p = timed([PY, "-m", "memray", "run", "--native", "-q", "-f", "-o", str(out), *argv[1:]],
                    env, PEER_TIMEOUT)
    if p is None:
        return wall, {"note": f"did not finish in {PEER_TIMEOUT} s (killed)"}
    if p.returncode != 0:
        return wall, {"note": f"exit {p.returncode}: {p.stderr.strip()[-200:]}"}
    stats = subprocess.run([PY, "-m", "memray", "stats", str(out)], env=env,
                           capture_output=True, text=True).stdout
    # Its first location by size among the allocations it recorded.
    m = re.search(r"largest allocating locations \(by size\):\s*\n\s*- (\S+)", stats)
    found = m.group(1) if m else "-"
    return wall, {"found": found, "right": found.endswith(site)}


def heaptrack(argv, env, site, tmp):
    out = Path(tmp) / "heaptrack"
    wall, p = timed(["heaptrack", "-o", str(out), *argv], env, PEER_TIMEOUT)
    if p is None:
        return wall, {"note": f"did not finish in {PEER_TIMEOUT} s (killed)"}
    data = next(Path(tmp).glob("heaptrack*.zst"), None)
    if p.returncode != 0 or data is None:
        return wall, {"note": f"exit {p.returncode}"}
    text = subprocess.run(["heaptrack_print", "-f", str(data), "-l", "1"], capture_output=True,
                          text=True).stdout
    leaks = text.split("MEMORY LEAKS", 1)[-1]
    m = re.search(r"at (\S+:\d+)", leaks)
    found = m.group(1) if m else "-"
    return wall, {"found": found, "right": found.endswith(site)}


def loop_s(stdout):
    """The training loop's own seconds, where the program prints them ("loop 5.21 s", or the
    Trainer's "'train_runtime': 5.21")."""
    m = re.search(r"(?:loop |'train_runtime': )(\d+\.\d+)", stdout or "")
    return float(m.group(1)) if m else None


def row(name, how, wall, base, info):
    ratio = f"{wall / base:.2f}×" if base else ""
    if info.get("loop") and info.get("base_loop"):
        ratio += f" (loop {info['loop'] / info['base_loop']:.2f}×)"
    rss = f"{info['rss'] / 2**20:.0f} MiB" if info.get("rss") else ""
    lost = "" if "lost" not in info else f"{info['lost']:,} ({info['unmatched']:,})"
    found = info.get("note") or (
        "" if "found" not in info else f"{'yes' if info['right'] else 'no'}: {info['found']}")
    print(f"| {name} | {how} | {wall:.1f} s | {ratio} | {rss} | {lost} | {found} |", flush=True)


def leaktracer_once(argv, env, site):
    """leaktracer's default on `argv`, in a directory of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        return leaktracer(argv, env, [], site, tmp)


def main():
    build = ROOT / "target/bench-workloads"
    build.mkdir(parents=True, exist_ok=True)
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.machine())
    print(f"{time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores ({cpu}), "
          f"Linux {platform.release()}, CPython {platform.python_version()}\n")
    print("| workload | how | wall | ratio | leaktracer peak RSS | records lost (unmatched frees) "
          "| leak at its line |")
    print("|---|---|---|---|---|---|---|")
    for name, lang, argv, source in workloads(build):
        if ONLY not in name:
            continue
        site = leak_site(source)
        env = PY_ENV if lang == "python" else dict(os.environ)
        base, p = timed(argv, env)
        base_loop = loop_s(p.stdout)
        row(name, "untraced", base, 0, {"note": "" if p.returncode == 0 else f"exit {p.returncode}"})
        torch = "PyTorch" in name
        hows = [("leaktracer", [])]
        if "long" in name:
            wall, info = leaktracer_once(argv, env, site)
            row(name, "leaktracer (tensors engaged)", wall, base, {**info, "base_loop": base_loop})
            continue
        if torch:
            # Every CPU tensor traced from the start (the default traces them once pages grow).
            hows.append(("--tensors all", ["--tensors", "all"]))
        if site:
            hows += [("--heap sampled", ["--heap", "sampled"]), ("--heap full", ["--heap", "full"])]
        for how, flags in hows:
            with tempfile.TemporaryDirectory() as tmp:
                wall, info = leaktracer(argv, env, flags, site, tmp)
            if how == "leaktracer" and torch:
                how += " (tensors engaged)" if info.get("tensors") else " (tensors not engaged)"
            row(name, how, wall, base, {**info, "base_loop": base_loop})
        if not site:
            continue
        if lang == "python":
            with tempfile.TemporaryDirectory() as tmp:
                wall, info = memray(argv, env, site, tmp)
            row(name, "memray --native", wall, base, info)
        with tempfile.TemporaryDirectory() as tmp:
            wall, info = heaptrack(argv, env, site, tmp)
        row(name, "heaptrack", wall, base, info)


if __name__ == "__main__":
    main()
