"""Launches one configuration (and cuBLAS) on a square problem a few times, for a profiler to
look at: `ncu --kernel-name regex:'ag_simt|gemm' python benchmarks/profile_kernel.py CONFIG`."""

from __future__ import annotations

import argparse
import sys

import cupy

from autogemm.bench import random_uniform
from autogemm.config import SimtConfig
from autogemm.launch import bind


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config", help="config name")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    a = random_uniform((args.size, args.size), seed=1)
    b = random_uniform((args.size, args.size), seed=2)
    run, c = bind(SimtConfig.from_name(args.config), a, b)
    for _ in range(args.repeats):
        run()
        cupy.matmul(a, b)
    cupy.cuda.Device().synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
