"""Runs `autogemm tune` (the command itself, default budget unless told otherwise) for a few
problems and records the result, the trial counts and the wall time of the whole command, from
its start to the printed table, in benchmarks/results/<device>.md.

    python benchmarks/bench_tune.py                       # 4096^3, 8192^3, 4095x4097x1023
    python benchmarks/bench_tune.py --problem 4096 4096 4096 --trials 100
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

DEFAULT_PROBLEMS = [(4096, 4096, 4096), (8192, 8192, 8192), (4095, 4097, 1023)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", type=int, nargs=3, action="append", metavar=("M", "N", "K"))
    parser.add_argument("--trials", type=int, help="override the default budget")
    parser.add_argument("--timeout", type=float, help="override the default search time")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--compute", default="")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    rows = []
    for m, n, k in args.problem or DEFAULT_PROBLEMS:
        cmd = [sys.executable, "-m", "autogemm.cli", "tune", "--M", str(m), "--N", str(n), "--K", str(k), "--json",
               "--dtype", args.dtype] + (["--compute", args.compute] if args.compute else [])
        if args.trials:
            cmd += ["--trials", str(args.trials)]
        if args.timeout:
            cmd += ["--timeout", str(args.timeout)]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            print(f"{m}x{n}x{k}: tune failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        result = json.loads(proc.stdout)
        result["command_wall_s"] = wall
        rows.append(result)
        t = result["trials"]
        print(f"{m}x{n}x{k}: {result['config']} {result['tflops']:.2f} TFLOP/s, cuBLAS {result['cublas_tflops']:.2f}, "
              f"ratio {result['ratio']:.3f}; {t['valid']} valid / {t['rejected']} rejected / {t['failed']} failed; "
              f"command {wall:.1f} s", flush=True)

    if not args.no_write and rows:
        from autogemm.gpu.launch import current_device

        dev = current_device()
        budget = "default budget" if not (args.trials or args.timeout) else f"trials={args.trials}, timeout={args.timeout}"
        lines = ["## `autogemm tune` (`benchmarks/bench_tune.py`)", "",
                 f"{dev.name}, {report.versions()}. Wall time is the whole command, start to printed table; the "
                 "ratio is against cupy.matmul re-timed with the finalists in the same run. Each row is one run "
                 "(date and budget in the row).",
                 "", "| problem | best config | TFLOP/s | cuBLAS TFLOP/s | ratio | trials valid / rejected / failed "
                 "| wall s | date, budget |",
                 "| --- | --- | ---: | ---: | ---: | --- | ---: | --- |"]
        new = {}
        for r in rows:
            t = r["trials"]
            new[r["problem"]] = (f"| {r['problem']} | `{r['config']}` | {r['tflops']:.2f} | {r['cublas_tflops']:.2f} | "
                                 f"{r['ratio']:.3f} | {t['valid']} / {t['rejected']} / {t['failed']} | "
                                 f"{r['command_wall_s']:.1f} | {report.today()}, {budget} |")
        path = report.update_table(dev.slug, dev.name, "bench_tune", lines, new)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
