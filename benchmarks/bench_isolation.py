"""Wall time of the same tune with and without fault isolation (measuring in a separate process
that owns the GPU), in one run: `autogemm tune` with a fixed trial budget and no time limit,
both in memory so that neither resumes the other.

    python benchmarks/bench_isolation.py [--M 4096] [--trials 150]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402


def run(m: int, trials: int, isolated: bool) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "autogemm.cli", "tune", "--M", str(m), "--trials", str(trials), "--timeout", "100000",
           "--storage", ":memory:", "--json"]
    if not isolated:
        cmd.append("--no-isolation")
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return wall, json.loads(proc.stdout)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--M", type=int, default=4096)
    parser.add_argument("--trials", type=int, default=150)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for isolated in (False, True):
        wall, result = run(args.M, args.trials, isolated)
        rows.append((isolated, wall, result))
        print(f"isolation {'on ' if isolated else 'off'}: {wall:.1f} s, {result['trials']['valid']} valid trials, "
              f"best {result['config']} {result['ratio']:.3f}x cuBLAS, restarts {result['restarts']}", flush=True)
    off, on = rows[0][1], rows[1][1]
    print(f"isolation costs {100 * (on / off - 1):+.1f}% wall time")
    if not args.no_write:
        from autogemm.gpu.launch import current_device

        dev = current_device()
        lines = ["## Fault isolation overhead (`benchmarks/bench_isolation.py`)", "",
                 f"{dev.name}, {report.today()}: `autogemm tune --M {args.M} --trials {args.trials}` (no time limit, "
                 "in-memory study), the whole command timed.", "",
                 "| isolation | wall s | valid trials | best ratio vs cuBLAS |", "| --- | ---: | ---: | ---: |"]
        for isolated, wall, result in rows:
            lines.append(f"| {'on' if isolated else 'off'} | {wall:.1f} | {result['trials']['valid']} | {result['ratio']:.3f} |")
        lines.append("")
        lines.append(f"Isolation costs {100 * (on / off - 1):+.1f}% of the wall time.")
        path = report.update_section(dev.slug, dev.name, "bench_isolation", "\n".join(lines))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
