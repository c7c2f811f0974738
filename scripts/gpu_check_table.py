"""The table of scripts/gpu-check.sh: one row per case from the files it left in DIR.
  python3 scripts/gpu_check_table.py DIR SCRIPT CASE..."""
import collections
import json
import os
import sys


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def figures(text):
    return next((json.loads(l) for l in text.splitlines() if l.startswith("{")), {})


def script_line(stack, script):
    """The innermost frame of the script in a stack's frames (innermost first), or None."""
    for f in stack["frames"]:
        if f.get("module") == "python" and os.path.basename(f.get("file") or "") == script:
            return f.get("line")
    return None


def held(stack):
    """What a stack holds: its bytes, or for one released at the end, its last window's peak."""
    if not stack.get("released"):
        return stack["bytes"], stack["blocks"]
    windows = (stack.get("verdict") or {}).get("windows") or [{}]
    return windows[-1].get("peak", 0), None


def top(per_line):
    if not per_line:
        return "-"
    line, (b, n) = max(per_line.items(), key=lambda kv: kv[1][0])
    return f"{line}: {b} ({n if n is not None else '?'})"


def row(d, name, script):
    rd = lambda ext: read(os.path.join(d, name + ext))
    rc, text = rd(".rc").strip(), rd(".out")
    leaks = [l.strip() for l in text.splitlines() if l.strip().startswith("LEAK")]
    named = "; ".join(f"{l.split()[1]} {l.rsplit(': ', 1)[-1]}" for l in leaks) or "-"
    oracle = figures(rd(".oracle"))
    untraced = figures(rd(".untraced"))
    traced = figures(text)
    try:
        r = json.loads(rd(".json").strip().splitlines()[-1])
    except (IndexError, ValueError) as e:
        return f"| {name} | {rd('.expected').strip()} | {rc} | no report: {e} |"
    blocks = collections.defaultdict(lambda: [0, 0])
    verdicts = set()
    for s in r["stacks"]:
        line = script_line(s, script) or 0
        if s["kind"] != "torch_block":
            continue
        b, n = held(s)
        blocks[line][0] += b
        blocks[line][1] = None if n is None or blocks[line][1] is None else blocks[line][1] + n
        if line:
            verdicts.add((s.get("verdict") or {}).get("verdict", "none"))
    every = {str(k): tuple(v) for k, v in blocks.items()}
    oracle_every = {k: tuple(v) for k, v in (oracle.get("oracle") or {}).items()}
    if any(s.get("released") for s in r["stacks"] if s["kind"] == "torch_block"):
        same = "- (released)"
    elif not oracle_every:
        same = "-"
    else:
        differ = sorted(set(every) ^ set(oracle_every) | {k for k in every if every[k] != oracle_every.get(k)})
        same = "yes" if not differ else "no: " + ", ".join(differ)
    blocks = {k: v for k, v in blocks.items() if k}
    ora = {k: v for k, v in oracle_every.items() if k != "0"}
    dev = [s for s in r["stacks"] if s["kind"] == "device"]
    dev_verdicts = "/".join(sorted({(s.get("verdict") or {}).get("verdict", "none") for s in dev}))
    gpu = [p for p in r["gpu"]["processes"] if p.get("nvml_bytes")]
    nvml = ", ".join(f"{p['nvml_bytes']} ({p.get('nvml_at_s') or 0:.1f} s)" for p in gpu) or "-"
    t_u, t_t = float(rd(".untraced-s") or 0), float(rd(".traced-s") or 0)
    l_u, l_t = untraced.get("loop_s"), traced.get("loop_s")
    loop = f"{l_u} / {l_t} ({l_t / l_u:.2f}×)" if l_u and l_t else "-"
    return (
        f"| {name} | {rd('.expected').strip()} | {rc} | {named} "
        f"| {top({k: tuple(v) for k, v in blocks.items()})} {'/'.join(sorted(verdicts)) or ''} "
        f"| {top(ora)} | {same} | {untraced.get('memory_allocated')} | {r['totals']['torch_block']['bytes']} "
        f"| {r['totals']['device']['bytes']} {dev_verdicts} | {nvml} | {r['losses']['ringbuf_full']} "
        f"| {t_u:.1f} / {t_t:.1f} ({t_t / t_u if t_u else 0:.2f}×) | {loop} |"
    )


def main():
    d, script, cases = sys.argv[1], os.path.basename(sys.argv[2]), sys.argv[3:]
    print(
        "| case | expected | exit | what check names | torch_block at the script's lines: "
        "bytes (blocks), verdict | oracle: bytes (blocks) allocated at the line | "
        "every line (and no line) as the oracle | "
        "memory_allocated | torch_block total | device bytes, verdicts | NVML (when) | lost "
        "| wall s untraced / traced | loop s untraced / traced |"
    )
    print("|" + "---|" * 14)
    for name in cases:
        print(row(d, name, script))


main()
