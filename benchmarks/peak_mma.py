"""The ceiling of the mma.sync path: throughput of back-to-back `mma.sync` instructions with no
memory traffic (each warp keeps 8 independent accumulator blocks busy; registers only), per type,
next to cuBLAS at 4096^3 in the same run. A GEMM kernel built on mma.sync cannot beat this rate,
so ceiling / cuBLAS bounds the ratio the tensor-core template can reach.

    python benchmarks/peak_mma.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

from autogemm.measure.bench import cublas_runner, random_uniform, time_gpu, warm_up  # noqa: E402
from autogemm.gpu.launch import current_device  # noqa: E402
from autogemm.problem import Problem  # noqa: E402

# (dtype, compute, PTX shape, PTX operand type, A registers, B registers, accumulator type)
KINDS = [
    ("float16", "fp32", "m16n8k16", "f16", 4, 2, "float"),
    ("bfloat16", "fp32", "m16n8k16", "bf16", 4, 2, "float"),
    ("float32", "tf32", "m16n8k8", "tf32", 4, 2, "float"),
    ("float64", "fp64", "m16n8k8", "f64", 4, 2, "double"),
]
CHAINS = 8  # independent accumulator blocks per warp
ITERATIONS = 4096

SOURCE = r"""
extern "C" __global__ void peak(ACC* out, int iterations) {
    ACC acc[CHAINS][4];
    REG a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = (REG)(threadIdx.x + i);
    for (int i = 0; i < 2; ++i) b[i] = (REG)(threadIdx.x * 3 + i);
    for (int c = 0; c < CHAINS; ++c)
        for (int e = 0; e < 4; ++e) acc[c][e] = 0;
    for (int it = 0; it < iterations; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
            asm volatile("mma.sync.aligned.SHAPE.row.col.DT.OT.OT.DT { %0, %1, %2, %3 }, { %4, %5, %6, %7 }, "
                         "{ %8, %9 }, { %0, %1, %2, %3 };\n"
                         : "+CA"(acc[c][0]), "+CA"(acc[c][1]), "+CA"(acc[c][2]), "+CA"(acc[c][3])
                         : "CR"(a[0]), "CR"(a[1]), "CR"(a[2]), "CR"(a[3]), "CR"(b[0]), "CR"(b[1]));
        }
    }
    ACC sum = 0;
    for (int c = 0; c < CHAINS; ++c)
        for (int e = 0; e < 4; ++e) sum += acc[c][e];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;   // keeps the mmas alive
}
"""


def kernel_for(shape, operand, accumulator):
    double = operand == "f64"
    code = (SOURCE.replace("CHAINS", str(CHAINS)).replace("SHAPE", shape).replace("ACC", accumulator)
            .replace("REG", "double" if double else "unsigned").replace("OT", operand)
            .replace("DT", "f64" if double else "f32").replace("CA", "d" if double else "f")
            .replace("CR", "d" if double else "r"))
    return cupy.RawKernel(code, "peak", options=("-std=c++17",))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results alone")
    args = parser.parse_args(argv)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    for dtype, compute, shape, operand, _, _, accumulator in KINDS:
        # cuBLAS first: the register-only loop heats the chip more than a real GEMM does
        size = 4096
        problem = Problem(size, size, size, dtype=dtype, compute=compute)
        a, b = random_uniform((size, size), dtype, seed=1), random_uniform((size, size), dtype, seed=2)
        c = cupy.empty((size, size), dtype=a.dtype)
        blas = cublas_runner(problem, a, b, c)
        warm_up(blas)
        blas_ms = time_gpu(lambda _: blas(), warmup=2, repeats=20).median_ms
        blas_tflops = 2 * size**3 / (blas_ms * 1e-3) / 1e12
        kernel = kernel_for(shape, operand, accumulator)
        m, n, k = (int(x) for x in shape[1:].replace("n", " ").replace("k", " ").split())
        blocks, threads = sms * 4, 256
        out = cupy.empty(blocks * threads, dtype=np.float64 if operand == "f64" else np.float32)
        run = lambda: kernel((blocks,), (threads,), (out, np.int32(ITERATIONS)))  # noqa: E731
        warm_up(run)
        ms = time_gpu(lambda _: run(), warmup=2, repeats=20).median_ms
        flops = 2 * m * n * k * CHAINS * ITERATIONS * blocks * threads // 32
        peak = flops / (ms * 1e-3) / 1e12
        rows.append((dtype, compute, shape, peak, blas_tflops))
        print(f"{dtype}/{compute} mma.sync.{shape}: {peak:.1f} TFLOP/s; cuBLAS 4096^3 {blas_tflops:.1f} TFLOP/s; "
              f"ceiling/cuBLAS {peak / blas_tflops:.3f}", flush=True)
    if not args.no_write:
        device = current_device()
        lines = ["## mma.sync ceiling (`benchmarks/peak_mma.py`)", "",
                 f"{device.name}, {report.today()}, {report.versions()}. Back-to-back `mma.sync` from registers "
                 f"({CHAINS} independent accumulator blocks per warp, {sms * 4} blocks of 256 threads, no memory "
                 "traffic), next to cuBLAS at 4096³ timed in the same run: no kernel built on these instructions "
                 "can pass the ceiling.", "",
                 "| type | instruction | ceiling TFLOP/s | cuBLAS 4096³ TFLOP/s | ceiling / cuBLAS |",
                 "| --- | --- | ---: | ---: | ---: |"]
        for dtype, compute, shape, peak, blas_tflops in rows:
            lines.append(f"| {dtype}/{compute} | mma.sync.{shape} | {peak:.1f} | {blas_tflops:.1f} | "
                         f"{peak / blas_tflops:.3f} |")
        path = report.update_section(device.slug, device.name, "peak_mma", "\n".join(lines))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
