"""Host overhead and GPU time of `autogemm.matmul` against `cupy.matmul`, in one run.

For 64^3, 256^3, 1024^3 and 4096^3 (FP32, NN): makes sure a tuned entry exists (tunes with the
given budget if not), then measures the wall time per call of each (many back-to-back calls,
synchronized once at the end: at small sizes this is host overhead) and, at 4096^3, the GPU time
of both with CUDA events around single calls, alternating between the two. Results in benchmarks/results/<device>.md.

    python benchmarks/bench_dispatch.py [--tune-trials 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

SIZES = (64, 256, 1024, 4096)


def wall_per_call(fn, calls: int, rounds: int = 7) -> float:
    import cupy

    stream = cupy.cuda.get_current_stream()
    for _ in range(10):
        fn()
    stream.synchronize()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        stream.synchronize()
        samples.append((time.perf_counter() - started) / calls)
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tune-trials", type=int, default=40, help="budget when a size has no cached entry")
    parser.add_argument("--gpu-samples", type=int, default=200,
                        help="alternating single-call timings of each at 4096^3 (default 200)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    import cupy
    import numpy as np

    import autogemm
    from autogemm.measure.bench import random_uniform, time_gpu, warm_up
    from autogemm.gpu.launch import current_device

    device = current_device()
    rows = []
    gpu_ratio = None
    for size in SIZES:
        a, b = random_uniform((size, size), seed=1), random_uniform((size, size), seed=2)
        if autogemm.explain(a, b)["source"] not in ("cache", "shipped cache"):
            autogemm.tune(size, trials=args.tune_trials, timeout=90)
        explanation = autogemm.explain(a, b)
        calls = max(20, min(2000, int(2e11 // (2 * size**3))))
        ours = wall_per_call(lambda: autogemm.matmul(a, b), calls)
        theirs = wall_per_call(lambda: cupy.matmul(a, b), calls)
        rows.append((size, explanation["source"], explanation["config"], ours * 1e6, theirs * 1e6))
        print(f"{size}^3: autogemm.matmul {ours * 1e6:.1f} us/call, cupy.matmul {theirs * 1e6:.1f} us/call "
              f"({explanation['source']}: {explanation['config']})", flush=True)
        if size == 4096:
            c, c2 = cupy.empty((size, size), np.float32), cupy.empty((size, size), np.float32)
            ours_call = lambda: autogemm.matmul(a, b, out=c)  # noqa: E731
            theirs_call = lambda: cupy.matmul(a, b, out=c2)  # noqa: E731
            warm_up(ours_call)
            warm_up(theirs_call)
            # one call of each in turn, each between its own CUDA events, so that clock and
            # temperature drift during the run weigh on both alike; medians of all samples
            ours_ms, theirs_ms = [], []
            for _ in range(args.gpu_samples):
                ours_ms.append(time_gpu(lambda _: ours_call(), warmup=0, repeats=1).median_ms)
                theirs_ms.append(time_gpu(lambda _: theirs_call(), warmup=0, repeats=1).median_ms)
            g_ours, g_theirs = statistics.median(ours_ms), statistics.median(theirs_ms)
            # the ratio of each adjacent pair shows the spread of the comparison itself
            pair_ratios = sorted(t / o for o, t in zip(ours_ms, theirs_ms))
            quartiles = statistics.quantiles(pair_ratios, n=4)
            gpu_ratio = (g_ours, g_theirs, quartiles[0], quartiles[2])
            print(f"4096^3 GPU time: autogemm {g_ours:.3f} ms, cupy.matmul {g_theirs:.3f} ms: "
                  f"{g_theirs / g_ours:.3f}x (pairs: quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, "
                  f"{args.gpu_samples} pairs)", flush=True)
    if not args.no_write:
        lines = ["## `autogemm.matmul` overhead (`benchmarks/bench_dispatch.py`)", "",
                 f"{device.name}, {report.today()}, {report.versions()}. Wall time per call of back-to-back calls "
                 "(synchronized once per round, median of 7 rounds), FP32 NN, CuPy operands, output allocated by "
                 "the call.", "",
                 "| size | kernel source | config | autogemm.matmul µs/call | cupy.matmul µs/call |",
                 "| --- | --- | --- | ---: | ---: |"]
        for size, source, config, ours, theirs in rows:
            lines.append(f"| {size}³ | {source} | `{config}` | {ours:.1f} | {theirs:.1f} |")
        if gpu_ratio:
            ours, theirs, low, high = gpu_ratio
            lines += ["", f"GPU time at 4096³ (CUDA events around single calls, the two alternating, median of "
                          f"{args.gpu_samples} each): autogemm {ours:.3f} ms, cupy.matmul {theirs:.3f} ms, ratio "
                          f"{theirs / ours:.3f}x; per-pair ratios have quartiles {low:.3f}-{high:.3f}."]
        path = report.update_section(device.slug, device.name, "bench_dispatch", "\n".join(lines))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
