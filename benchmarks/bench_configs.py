"""Hand-picked SIMT configurations against cuBLAS (cupy.matmul), FP32, in one run.

For each size: random inputs, a float64 reference, cuBLAS timed on the same inputs, then each
configuration checked (relative error <= 1e-5, output poisoned with NaN first) and timed. Writes
the table to benchmarks/results/<device>.md and prints it.

    python benchmarks/bench_configs.py                 # 4096^3 and 8192^3
    python benchmarks/bench_configs.py --explore 200   # also time 200 random valid configs at the first size
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

from autogemm.measure.bench import random_uniform, reference_gemm, relative_error, time_gpu  # noqa: E402
from autogemm.kernels.compile import CompileError, compile_many  # noqa: E402
from autogemm.families import SimtConfig  # noqa: E402
from autogemm.gpu.launch import bind, current_device  # noqa: E402
from autogemm.problem import Problem  # noqa: E402
from autogemm.kernels.render import render  # noqa: E402
from autogemm.kernels.space import SearchSpace  # noqa: E402

# Strong configurations picked by hand from the optimisation literature (warp-tiled SGEMM, thread
# tiles of 8x8 and 8x16 built from 4-wide chunks, 128-bit loads everywhere).
HAND_PICKED = [
    SimtConfig(128, 128, 8, 32, 64, 8, 8, 4, 4, 2, "pad", 8, 1),
    SimtConfig(128, 128, 8, 64, 32, 8, 8, 4, 4, 2, "pad", 8, 1),
    SimtConfig(128, 128, 8, 32, 64, 8, 8, 4, 4, 2, "swizzle", 8, 1),
    SimtConfig(128, 128, 16, 32, 64, 8, 8, 4, 4, 2, "swizzle", 8, 1),
    SimtConfig(128, 256, 8, 64, 64, 8, 16, 4, 4, 2, "pad", 8, 1),
    SimtConfig(128, 256, 8, 64, 64, 8, 16, 4, 4, 2, "swizzle", 8, 1),
    SimtConfig(256, 128, 8, 64, 64, 16, 8, 4, 4, 2, "pad", 8, 1),
    SimtConfig(128, 256, 16, 64, 64, 8, 16, 4, 4, 3, "swizzle", 8, 1),
    SimtConfig(128, 128, 16, 32, 64, 8, 8, 4, 4, 3, "swizzle", 8, 1),
    SimtConfig(128, 128, 16, 32, 64, 8, 8, 4, 4, 4, "pad", 8, 1),
    SimtConfig(128, 128, 8, 32, 64, 8, 8, 4, 4, 1, "pad", 8, 1),
    SimtConfig(64, 128, 16, 32, 64, 8, 8, 4, 4, 3, "swizzle", 8, 1),
]


def measure(configs, size: int, device, warmup: int, repeats: int, batch: int):
    """Checks and times each config at size^3; returns (cuBLAS timing, rows)."""
    import cupy

    problem = Problem(size, size, size)
    a = random_uniform((size, size), seed=1)
    b = random_uniform((size, size), seed=2)
    c = cupy.empty((size, size), dtype=np.float32)
    c_blas = cupy.empty_like(c)
    expected = reference_gemm(a, b)

    def repeat(fn):
        def run(_):
            for _ in range(batch):
                fn()
        return run

    blas = time_gpu(repeat(lambda: cupy.matmul(a, b, out=c_blas)), warmup=warmup, repeats=repeats)
    blas_ms = blas.median_ms / batch
    rows = []
    for config in configs:
        row = {"config": config.name, "size": size}
        reasons = config.check(problem, device)
        if reasons:
            rows.append({**row, "status": "rejected", "detail": "; ".join(reasons)})
            continue
        try:
            c.fill(np.nan)
            run, _ = bind(config, a, b, c)
            run()
            error = relative_error(c, expected)
            if not error <= 1e-5:
                rows.append({**row, "status": "wrong", "detail": f"relative error {error:.3g}"})
                continue
            timing = time_gpu(repeat(run), warmup=warmup, repeats=repeats)
        except CompileError as exc:
            rows.append({**row, "status": "compile", "detail": str(exc).splitlines()[0]})
            continue
        except cupy.cuda.driver.CUDADriverError as exc:
            rows.append({**row, "status": "launch", "detail": str(exc)})
            continue
        ms = timing.median_ms / batch
        rows.append({**row, "status": "ok", "ms": ms, "tflops": problem.flops / ms / 1e9,
                     "ratio": blas_ms / ms, "error": error})
    # cuBLAS once more at the end: the ratio uses the mean of both, so drift shows up in neither
    blas_end = time_gpu(repeat(lambda: cupy.matmul(a, b, out=c_blas)), warmup=warmup, repeats=repeats)
    blas_ms = (blas_ms + blas_end.median_ms / batch) / 2
    for row in rows:
        if row["status"] == "ok":
            row["ratio"] = blas_ms / row["ms"]
    return blas_ms, rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--explore", type=int, default=0, help="also time this many random valid configs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", help="write every measured row as JSON lines to this file")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results alone")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)

    device = current_device()
    explored = []
    if args.explore:
        explored = SearchSpace.load().sample(args.explore, Problem(args.sizes[0], args.sizes[0], args.sizes[0]),
                                             device, seed=args.seed)
    started = time.perf_counter()
    sources = [render(c, Problem(s, s, s)) for s in args.sizes for c in HAND_PICKED]
    sources += [render(c, Problem(args.sizes[0], args.sizes[0], args.sizes[0])) for c in explored]
    compiled = compile_many(sources, device.arch, args.jobs)
    failed = sum(isinstance(v, Exception) for v in compiled.values())
    print(f"compiled {len(compiled)} kernels in {time.perf_counter() - started:.1f} s ({failed} failed)", flush=True)

    all_rows = []
    sections = []
    for index, size in enumerate(args.sizes):
        configs = HAND_PICKED + (explored if index == 0 else [])
        batch = max(1, int(4096**3 * 4 // size**3))
        blas_ms, rows = measure(configs, size, device, warmup=3, repeats=args.repeats, batch=batch)
        blas_tflops = 2 * size**3 / blas_ms / 1e9
        all_rows += rows
        hand = [r for r in rows if r["config"] in {c.name for c in HAND_PICKED}]
        lines = [f"### {size}×{size}×{size} FP32 (NN), cuBLAS {blas_tflops:.1f} TFLOP/s", "",
                 "| config | TFLOP/s | cuBLAS TFLOP/s | ratio | rel. error |", "| --- | ---: | ---: | ---: | ---: |"]
        for row in sorted(hand, key=lambda r: -r.get("tflops", 0)):
            if row["status"] == "ok":
                lines.append(f"| `{row['config']}` | {row['tflops']:.1f} | {blas_tflops:.1f} | {row['ratio']:.3f} | {row['error']:.1e} |")
            else:
                lines.append(f"| `{row['config']}` | {row['status']}: {row['detail'][:60]} | {blas_tflops:.1f} | | |")
        sections.append("\n".join(lines))
        print("\n".join(lines), flush=True)
        if index == 0 and explored:
            ok = sorted((r for r in rows if r["status"] == "ok" and r["config"] not in {c.name for c in HAND_PICKED}),
                        key=lambda r: -r["tflops"])
            statuses = {}
            for r in rows[len(HAND_PICKED):]:
                statuses[r["status"]] = statuses.get(r["status"], 0) + 1
            print(f"\nexplored {len(explored)} random configs at {size}^3: {statuses}")
            for r in ok[:15]:
                print(f"  {r['config']:<48} {r['tflops']:6.1f} TFLOP/s  ratio {r['ratio']:.3f}")

    if args.record:
        with open(args.record, "w") as out:
            for row in all_rows:
                out.write(json.dumps(row) + "\n")
    if not args.no_write:
        body = (f"## Hand-picked SIMT configurations (`benchmarks/bench_configs.py`)\n\n"
                f"{device.name}, {report.today()}, {report.versions()}. Median of {args.repeats} CUDA-event "
                f"timings; cuBLAS is `cupy.matmul` on the same inputs in the same run.\n\n" + "\n\n".join(sections))
        path = report.update_section(device.slug, device.name, "bench_configs", body)
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
