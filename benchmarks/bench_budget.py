"""Is the default tuning budget enough? Runs `autogemm tune` with its default budget (timeout and
convergence stop) and with a 400-trial search (no timeout, no early stop), each on a fresh cache and
study, then times both winners and cuBLAS together in one process (interleaved rounds, the tuner's
own re-timing protocol). Reports the wall time of the default command and the default winner's
speed as a fraction of the 400-trial winner's.

    python benchmarks/bench_budget.py                    # 4096^3 FP32
    python benchmarks/bench_budget.py --M 2048 --dtype float16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402


def run_tune(args, extra: list[str], cache_dir: Path) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "autogemm.cli", "tune", "--M", str(args.m), "--N", str(args.n or args.m),
           "--K", str(args.k or args.m), "--dtype", args.dtype, "--json"] + extra
    env = dict(os.environ, AUTOGEMM_CACHE_DIR=str(cache_dir))
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout), wall


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--M", dest="m", type=int, default=4096)
    parser.add_argument("--N", dest="n", type=int)
    parser.add_argument("--K", dest="k", type=int)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--full-trials", type=int, default=400)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="autogemm-budget-"))
    default, default_wall = run_tune(args, [], root / "default")
    print(f"default budget: {default['config']} {default['ratio']:.3f}x, {default['trials']['valid']} trials, "
          f"{default_wall:.1f} s ({default.get('stopped') or 'timeout or trials'})", flush=True)
    full, full_wall = run_tune(args, ["--trials", str(args.full_trials), "--timeout", "1e9", "--patience", "0"],
                               root / "full")
    print(f"{args.full_trials} trials: {full['config']} {full['ratio']:.3f}x, {full_wall:.1f} s", flush=True)

    from autogemm.measure.evaluate import GpuEvaluator
    from autogemm.families import config_from_name
    from autogemm.gpu.launch import current_device
    from autogemm.problem import Problem

    problem = Problem(args.m, args.n or args.m, args.k or args.m, dtype=args.dtype)
    device = current_device()
    configs = [config_from_name(default["config"]), config_from_name(full["config"])]
    evaluator = GpuEvaluator(problem, device, jobs=2)
    try:
        measured, cublas_ms = evaluator.retime(configs)
    finally:
        evaluator.close()
    ms = [m.time_ms if m.ok else float("inf") for m in measured]
    # what each command serves: its kernel, or cuBLAS where the tune kept cuBLAS
    served = [cublas_ms if r["kept_cublas"] else t for r, t in zip((default, full), ms)]
    fraction = served[1] / served[0]
    kernels = ", ".join(f"{name} kernel {problem.flops / t / 1e9:.2f} TFLOP/s" if t != float("inf") else f"{name} kernel failed"
                        for name, t in (("default", ms[0]), (f"{args.full_trials}-trial", ms[1])))
    summary = (f"{problem}: default budget {default_wall:.1f} s wall ({default['trials']['valid']} trials; "
               f"{default.get('stopped') or 'search timeout'}), {args.full_trials}-trial search {full_wall:.1f} s. "
               f"Re-timed together: default winner {problem.flops / served[0] / 1e9:.2f} TFLOP/s, "
               f"{args.full_trials}-trial winner {problem.flops / served[1] / 1e9:.2f}, cuBLAS "
               f"{problem.flops / cublas_ms / 1e9:.2f}; the default reaches {fraction:.3f} of the "
               f"{args.full_trials}-trial result (what each serves; the generated winners: {kernels}).")
    print(summary)
    if not args.no_write:
        lines = ["## Default budget against a 400-trial search (`benchmarks/bench_budget.py`)", "",
                 f"{device.name}, {report.versions()}, {report.today()}.", "",
                 f"- default: `{default['config']}` (serves {'cuBLAS' if default['kept_cublas'] else 'it'})",
                 f"- {args.full_trials} trials: `{full['config']}` (serves {'cuBLAS' if full['kept_cublas'] else 'it'})",
                 "", summary]
        path = report.update_section(device.slug, device.name, "bench_budget", "\n".join(lines))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
