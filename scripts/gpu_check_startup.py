"""The start-up part of scripts/gpu-check.sh: where a traced job's seconds before its loop go.
Reads DIR/startup.* (the untraced runs' seconds, the traced run's seconds, log and report) and
prints the times side by side, the libraries looked at while the process was held (the longest
first), the layers that went in and when, and what the probes cost in the kernel.
Usage: gpu_check_startup.py DIR"""
import json
import re
import sys
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def field(line, name):
    m = re.search(rf"\b{name}=(\"[^\"]*\"|\S+)", line)
    return m.group(1).strip('"') if m else None


def main():
    d = Path(sys.argv[1])
    untraced = [float(x) for x in (d / "startup.untraced-s").read_text().split()]
    traced = float((d / "startup.traced-s").read_text())
    base = min(untraced)
    print(f"start-up (import torch, a first tensor on the device): untraced "
          f"{', '.join(f'{u:.2f}' for u in untraced)} s, traced {traced:.2f} s "
          f"({traced / base:.2f}× the faster)")
    for line in (d / "startup.untraced.out").read_text().splitlines()[-1:]:
        print(f"  untraced: {line}")
    for line in (d / "startup.out").read_text().splitlines():
        if line.startswith("first tensor"):
            print(f"  traced:   {line}")
    log = [ANSI.sub("", l) for l in (d / "startup.err").read_text().splitlines()]
    looked = []
    for l in log:
        if "code looked at" in l:
            looked.append((float(field(l, "ms") or 0), field(l, "held"), field(l, "library")))
    looked.sort(reverse=True)
    held = sum(ms for ms, h, _ in looked if h == "true")
    print(f"  libraries looked at: {len(looked)}, {held:.0f} ms of it while the process was held")
    for ms, h, lib in looked[:10]:
        print(f"    {ms:8.1f} ms  held={h}  {lib}")
    for l in log:
        if any(k in l for k in ("sampled", "window closed", "asked for", "taken out", "heap traced",
                                "tensors", "Python frames walked")):
            print(f"  {l[:200]}")
    costs = sorted([l for l in log if '"sample"' in l or " sample" in l and "cost_ms" in l],
                   key=lambda l: -float(field(l, "cost_ms") or 0))
    print(f"  samples: {len(costs)}; the costliest (CPU ms, wall ms):",
          ", ".join(f"{float(field(l, 'cost_ms')):.1f}/{float(field(l, 'wall_ms')):.1f}"
                    for l in costs[:5]))
    r = json.loads((d / "startup.json").read_text())
    print(f"  tracer peak RSS {r.get('tracer_peak_rss_bytes', 0) / 2**20:.0f} MiB, lost "
          f"{sum(v for k, v in r['losses'].items() if k in ('ringbuf_full', 'stack_table_full'))}")
    for c in r.get("probe_cost", [])[:10]:
        print(f"    {c['program']:32} {c['calls']:10} calls {c['ns'] / 1e6:10.1f} ms in the kernel")


main()
