"""What a kernel that only reads can reach, by size: the ceiling for memory-bound GEMMs (GEMV).

The skinny benchmark reports a GEMV's bandwidth against a 1 GiB device copy. A kernel that moves
tens of MB cannot reach that rate: its start, its first loads' latency and its last wave weigh on a
10-20 us kernel. This script times a kernel that reads N bytes with 16-byte loads and does nothing
else (the best of several grid shapes), on input sets rotated as the tuner rotates them so that L2
holds none of it, and prints its rate beside a same-size device copy's, as fractions of the 1 GiB
copy's.

    python benchmarks/read_ceiling.py              # 8 to 128 MB
    python benchmarks/read_ceiling.py --sizes 32   # MB
"""

from __future__ import annotations

import argparse

import numpy as np

from autogemm.measure.bench import rotation_count
from autogemm.measure.timing import gpu_time

READ_KERNEL = r'''
extern "C" __global__ void read_all(const uint4* __restrict__ p, long long n, unsigned* out) {
    // four independent 16-byte loads in flight per thread; the XOR keeps them from being dropped
    unsigned s = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
        s ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n; i += stride) s ^= __ldg(p + i).x;
    if (s == 0x12345678u) out[0] = s;
}
'''
COPY_BYTES = 1 << 30


def copy_ms(moved: int) -> float:
    """Milliseconds of a device copy moving `moved` bytes (half read, half written)."""
    import cupy

    src = cupy.ones(moved // 8, dtype=np.float32)
    dst = cupy.empty_like(src)
    return gpu_time(lambda i: cupy.copyto(dst, src), target_ms=20).median_ms


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128], help="MB read")
    args = parser.parse_args(argv)
    import cupy

    properties = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    l2, sms = properties["l2CacheSize"], properties["multiProcessorCount"]
    copy_rate = 2 * COPY_BYTES / (copy_ms(2 * COPY_BYTES) * 1e-3)  # 1 GiB read and written, as bench_skinny
    print(f"{properties['name'].decode()}: 1 GiB device copy {copy_rate / 1e9:.0f} GB/s")
    print("| MB | read-only kernel | of copy rate | same-size copy | of copy rate |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    read = cupy.RawKernel(READ_KERNEL, "read_all")
    out = cupy.zeros(1, dtype=np.uint32)
    for mb in args.sizes:
        nbytes = mb << 20
        buffers = [cupy.ones(nbytes // 4, dtype=np.float32) for _ in range(rotation_count(nbytes, l2))]
        best = float("inf")
        for blocks_per_sm, threads in ((1, 1024), (2, 1024), (2, 512), (4, 512), (4, 256), (8, 256), (16, 128)):
            runners = [lambda b=b, g=sms * blocks_per_sm, t=threads: read((g,), (t,), (b, np.int64(nbytes // 16), out))
                       for b in buffers]
            best = min(best, gpu_time(lambda i, runners=runners: runners[i % len(runners)](), target_ms=20).median_ms)
        same_ms = copy_ms(nbytes)
        read_rate, same_copy = nbytes / (best * 1e-3), nbytes / (same_ms * 1e-3)
        print(f"| {mb} | {best * 1e3:.1f} us | {read_rate / copy_rate:.0%} | {same_ms * 1e3:.1f} us | "
              f"{same_copy / copy_rate:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
