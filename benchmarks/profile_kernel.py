"""Launches one configuration (and cuBLAS on the same inputs) on a square problem a few times, for
a profiler to look at:

    ncu --kernel-name regex:'ag_|gemm|xmma' python benchmarks/profile_kernel.py CONFIG [--dtype float16]

Either family: SIMT names (128x128x8_w32x64_...) and tensor-core names (wmma_...)."""

from __future__ import annotations

import argparse
import sys

import cupy

from autogemm.measure.bench import cublas_runner, random_uniform
from autogemm.dtypes import DTYPES
from autogemm.families import config_from_name
from autogemm.gpu.launch import bind, compute_for
from autogemm.problem import Problem


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config name")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    config = config_from_name(args.config)
    compute = compute_for(config, args.dtype)  # a tensor-core config on float32 computes in TF32
    problem = Problem(args.size, args.size, args.size, dtype=args.dtype, compute=compute)
    a = random_uniform((args.size, args.size), args.dtype, seed=1)
    b = random_uniform((args.size, args.size), args.dtype, seed=2)
    run, c = bind(config, a, b)
    blas = cublas_runner(problem, a, b, cupy.empty_like(c))
    for _ in range(args.repeats):
        run()
        blas()
    cupy.cuda.Device().synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
