"""Tensor-core (WMMA) kernels against cuBLAS at 4096^3 and 8192^3, one table row per dtype and size.

For each type (FP16, BF16, TF32, FP64) the kernel is the one `autogemm tune` cached for the
4096^3 problem of that type on this device (run benchmarks/bench_tune.py --dtype ... first), or
the dispatcher's built-in default when nothing was tuned; the same kernel is then timed at every
size. Each kernel is checked against a float64 reference and timed like the tuner's finalists;
cuBLAS (cupy.matmul in the type's mode; cublasGemmEx for bfloat16) runs on the same inputs before
and after, and the ratio uses the mean of both. Results in benchmarks/results/<device>.md.

    python benchmarks/bench_wmma.py [--sizes 4096 8192] [--dtypes float16 tf32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

from autogemm.results.cache import TuningCache  # noqa: E402
from autogemm.serving.select import default_config  # noqa: E402
from autogemm.measure.evaluate import GpuMeasurer  # noqa: E402
from autogemm.gpu.launch import current_device  # noqa: E402
from autogemm.problem import Problem  # noqa: E402

# name on the command line -> (dtype, compute)
TYPES = {"float16": ("float16", "fp32"), "bfloat16": ("bfloat16", "fp32"), "tf32": ("float32", "tf32"),
         "float64": ("float64", "fp64")}


def kernel_for(dtype: str, compute: str, device) -> tuple[object, str]:
    """The config tuned for 4096^3 of this type, else the built-in default."""
    tuned = Problem(4096, 4096, 4096, dtype=dtype, compute=compute)
    found = TuningCache().lookup(tuned, device.slug)
    if found is not None:
        return found[0].config_object, "tuned at 4096³"
    return default_config(tuned, device), "built-in default"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(TYPES), default=list(TYPES))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    device = current_device()
    new_rows = {}
    for name in args.dtypes:
        dtype, compute = TYPES[name]
        config, source = kernel_for(dtype, compute, device)
        for size in args.sizes:
            problem = Problem(size, size, size, dtype=dtype, compute=compute)
            measurer = GpuMeasurer(problem, device)
            before = measurer.cublas_ms
            result = measurer.measure(config, None, repeats=10, final=True)
            blas_ms = (before + measurer.time_cublas()) / 2
            blas = problem.flops / blas_ms / 1e9
            key = f"{dtype}/{compute} {size}³"
            if result.ok:
                ratio = blas_ms / result.time_ms
                new_rows[key] = (f"| {key} | `{config.name}` | {source} | {result.tflops:.1f} | {blas:.1f} | "
                                 f"{ratio:.3f} | {result.rel_error:.1e} | {report.today()} |")
                print(f"{key}: {config.name} ({source}) {result.tflops:.1f} TFLOP/s, cuBLAS {blas:.1f}, "
                      f"ratio {ratio:.3f}", flush=True)
            else:
                new_rows[key] = f"| {key} | `{config.name}` | {source} | {result.kind}: {result.message[:60]} | " \
                                f"{blas:.1f} | | | {report.today()} |"
                print(f"{key}: {config.name} failed: {result.kind} {result.message[:200]}", flush=True)
    if not args.no_write and new_rows:
        lines = ["## Tensor-core kernels (`benchmarks/bench_wmma.py`)", "",
                 f"{device.name}, {report.versions()}. The kernel tuned for 4096³ of each type (or the built-in "
                 "default), timed at each size; cuBLAS on the same inputs in the same run (TF32 mode for TF32, "
                 "cublasGemmEx for bfloat16).", "",
                 "| type, size | config | kernel | TFLOP/s | cuBLAS TFLOP/s | ratio | rel. error | date |",
                 "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
        path = report.update_table(device.slug, device.name, "bench_wmma", lines, new_rows)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
