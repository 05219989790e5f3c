"""Host time per call of each piece of a served call, on a product small enough that the GPU keeps
up with the host (64x64x64): where the microseconds of autogemm.matmul's latency go, beside
torch.matmul's and cupy.matmul's. Wall-clock time of many calls in a row (synchronized every 100 calls),
divided by their number.

    python benchmarks/host_time.py [--dtype float16]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def per_call_us(call, calls: int = 3000, sync=None) -> float:
    """Host time of `call` in us: the best of three runs of `calls` calls, `sync()` (default: CuPy's
    current stream) every 100 calls and at the end, so that the queue never fills."""
    if sync is None:
        import cupy

        def sync():
            cupy.cuda.get_current_stream().synchronize()

    for _ in range(50):
        call()
    sync()
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        for i in range(calls):
            call()
            if i % 100 == 99:
                sync()
        sync()
        best = min(best, (time.perf_counter() - began) / calls * 1e6)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("AUTOGEMM_CACHE_DIR", tempfile.mkdtemp(prefix="autogemm-host-"))
    import cupy
    import torch

    import autogemm
    import autogemm.results.cache
    from autogemm.gpu.cublas_gemm import cublas_launcher
    from autogemm.gpu.operands import describe
    from autogemm.problem import Problem

    autogemm.results.cache.shipped_cache_dir = lambda: None
    n = args.size
    a = cupy.random.random((n, n)).astype(args.dtype)
    b = cupy.random.random((n, n)).astype(args.dtype)
    out = cupy.empty((n, n), dtype=args.dtype)
    ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
    problem = Problem(n, n, n, dtype=args.dtype)
    layouts = [describe(x, name).layout() for x, name in ((a, "a"), (b, "b"), (out, "out"))]
    launch = cublas_launcher(problem, *layouts)
    pa, pb, pc = a.data.ptr, b.data.ptr, out.data.ptr
    ndarray = cupy.ndarray
    shape, dtype = (n, n), out.dtype
    pieces = {
        "cupy.ndarray(shape, dtype)": lambda: ndarray(shape, dtype),
        "cupy.empty": lambda: cupy.empty(shape, dtype),
        "torch.empty": lambda: torch.empty((n, n), dtype=ta.dtype, device="cuda"),
        "cuBLASLt launch (prepared)": lambda: launch(pa, pb, pc, 1.0, 0.0),
        "cupy.cuda.get_current_stream().ptr": lambda: cupy.cuda.get_current_stream().ptr,
        "autogemm.matmul (fast path)": lambda: autogemm.matmul(a, b),
        "torch.matmul": lambda: torch.matmul(ta, tb),
        "cupy.matmul": lambda: cupy.matmul(a, b),
    }
    for name, call in pieces.items():
        print(f"{name:<40} {per_call_us(call):7.2f} us", flush=True)
    # latency (each call on an idle GPU): what comes before a launch counts, what comes after overlaps
    from autogemm.measure.timing import median_latency

    for shape in ((n, n, n), (1, 4096, 4096)):
        m, nn, k = shape
        a2 = cupy.random.random((m, k)).astype(args.dtype)
        b2 = cupy.random.random((k, nn)).astype(args.dtype)
        out2 = cupy.empty((m, nn), dtype=args.dtype)
        problem2 = Problem(m, nn, k, dtype=args.dtype)
        layouts2 = [describe(x, name).layout() for x, name in ((a2, "a"), (b2, "b"), (out2, "out"))]
        lt = cublas_launcher(problem2, *layouts2)
        legacy = cublas_launcher(problem2, *layouts2, api="gemmex")
        ta2, tb2 = torch.as_tensor(a2, device="cuda"), torch.as_tensor(b2, device="cuda")
        p2 = (a2.data.ptr, b2.data.ptr, out2.data.ptr)
        calls = {"cuBLASLt launch": lambda: lt(*p2, 1.0, 0.0), "cublasGemmEx launch": lambda: legacy(*p2, 1.0, 0.0),
                 "autogemm.matmul": lambda: autogemm.matmul(a2, b2), "torch.matmul": lambda: torch.matmul(ta2, tb2),
                 "cupy.matmul": lambda: cupy.matmul(a2, b2)}
        for name, us in median_latency(calls, rounds=200).items():
            print(f"latency {m}x{nn}x{k} {name:<28} {us * 1e3:7.2f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
