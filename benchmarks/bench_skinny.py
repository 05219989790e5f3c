"""Our own kernels against cuBLAS on the skinny and odd shapes (benchmarks/skinny.toml), in one run:
each problem is tuned as `autogemm tune` would tune it (every candidate space, --budget seconds of
search in all), and the best generated kernel's ratio to cuBLAS is reported whether or not it beat
cuBLAS (the cuBLAS fallback is not counted), with the ratio one call at a time where the tuner took
it. GEMV-like problems (M or N <= 16) also get the fraction of the device's copy bandwidth their
bytes moved reach (A, B and C once over the kernel's time), and cuBLAS's, against a device-to-device
copy measured in the same run.

    python benchmarks/bench_skinny.py --budget 30 [--only float32] [--layout nn]

Writes benchmarks/results/skinny-<device>.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_shapes import geomean, load_suite  # noqa: E402

GEMV_LIKE = 16
COPY_BYTES = 1 << 30


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s: 1 GiB read and written, median of 20 events."""
    import statistics

    import cupy

    src = cupy.ones(COPY_BYTES // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for i in range(23):
        start.record()
        cupy.copyto(dst, src)
        stop.record()
        stop.synchronize()
        if i >= 3:
            times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return 2 * COPY_BYTES / statistics.median(times)


def moved_bytes(problem) -> int:
    from autogemm import dtypes

    itemsize = dtypes.lookup(problem.dtype, problem.compute).itemsize
    return itemsize * problem.batch * (problem.m * problem.k + problem.k * problem.n + problem.m * problem.n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--suite", type=Path, default=HERE / "skinny.toml")
    parser.add_argument("--budget", type=float, default=30.0, help="seconds of search per problem (all spaces)")
    parser.add_argument("--layout", default="nn", choices=("nn", "nt", "tn", "tt"))
    parser.add_argument("--only", help="only problems whose key contains one of these comma-separated texts")
    parser.add_argument("--name", default="", help="suffix of the result files")
    args = parser.parse_args()
    wanted = args.only.split(",") if args.only else [""]
    import dataclasses

    import autogemm
    from autogemm.gpu.launch import current_device
    from autogemm.tuning.tuner import TuneError

    problems = [dataclasses.replace(p, trans_a=args.layout[0] == "t", trans_b=args.layout[1] == "t")
                for p in load_suite(args.suite)]
    problems = [p for p in problems if any(text in p.key for text in wanted)]
    os.environ["AUTOGEMM_CACHE_DIR"] = tempfile.mkdtemp(prefix="autogemm-skinny-")
    device = current_device()
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s", file=sys.stderr)
    rows, started = [], time.perf_counter()
    for problem in problems:
        try:
            result = autogemm.tune(problem, trials=10_000, timeout=args.budget)
        except TuneError as exc:  # the other problems still run; the table says this one was not measured
            rows.append({"problem": problem.key, "dtype": problem.dtype, "error": str(exc)})
            print(f"{problem.key}: not measured: {exc}", file=sys.stderr)
            continue
        row = {"problem": problem.key, "dtype": problem.dtype, "config": result.config.name,
               "family": result.config.family, "ratio": result.ratio, "single_call": result.single_call_ratio,
               "served": "cuBLAS" if result.kept_cublas else "kernel", "time_ms": result.time_ms,
               "cublas_ms": result.cublas_ms, "wall_s": result.wall_s,
               "searched": [f"{family} {ratio:.3f}x" for _, family, ratio, _, _ in result.searched]}
        if min(problem.m, problem.n) <= GEMV_LIKE:
            moved = moved_bytes(problem)
            row["bandwidth"] = moved / (result.time_ms / 1e3) / bandwidth
            row["cublas_bandwidth"] = moved / (result.cublas_ms / 1e3) / bandwidth
        rows.append(row)
        print(f"{problem.key}: {row['config']} {row['ratio']:.3f}x"
              + (f" (one call {row['single_call']:.3f}x)" if row["single_call"] else "")
              + (f", {row['bandwidth']:.0%} of copy bandwidth" if "bandwidth" in row else "")
              + f", {row['served']} served; {result.wall_s:.0f} s", file=sys.stderr)
    write(rows, device, bandwidth, args, time.perf_counter() - started)
    return 0


def write(rows, device, bandwidth, args, wall) -> None:
    out = HERE / "results" / f"skinny-{device.slug}-{args.layout}{'-' + args.name if args.name else ''}"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# Skinny and odd shapes on {device.name}, layout {args.layout.upper()}", "",
             f"Each problem tuned as `autogemm tune` tunes it, {args.budget:g} s of search in all its spaces "
             f"({wall:.0f} s for the run). Ratio: cuBLAS time over the best generated kernel's, back to back "
             f"(the tuner's final re-timing), whether or not it beat cuBLAS; one call: the tuner's call-by-call "
             f"check where it took it. Bandwidth: (A + B + C bytes) / time over a device copy's "
             f"{bandwidth / 1e9:.0f} GB/s, same run.", "",
             "| problem | best generated kernel | ratio | one call | served | bandwidth | cuBLAS bandwidth | spaces |",
             "| --- | --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['problem']} | not measured: {row['error']} | - | - | - | - | - | - |")
            continue
        single = f"{row['single_call']:.3f}" if row["single_call"] else "-"
        bw = f"{row['bandwidth']:.0%}" if "bandwidth" in row else "-"
        cbw = f"{row['cublas_bandwidth']:.0%}" if "cublas_bandwidth" in row else "-"
        lines.append(f"| {row['problem']} | {row['config']} | {row['ratio']:.3f} | {single} | {row['served']} | {bw} | "
                     f"{cbw} | {'; '.join(row['searched'])} |")
    lines += ["", "| dtype | shapes | geomean | min | not measured |", "| --- | ---: | ---: | ---: | ---: |"]
    for dtype in dict.fromkeys(row["dtype"] for row in rows):
        ratios = [row["ratio"] for row in rows if row["dtype"] == dtype and "error" not in row]
        missing = sum(1 for row in rows if row["dtype"] == dtype and "error" in row)
        summary = f"{geomean(ratios):.3f} | {min(ratios):.3f}" if ratios else "- | -"
        lines.append(f"| {dtype} | {len(ratios)} | {summary} | {missing} |")
    text = "\n".join(lines) + "\n"
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"device": device.name, "bandwidth": bandwidth, "budget": args.budget,
                                                   "layout": args.layout, "rows": rows}, indent=1))
    print(text)


if __name__ == "__main__":
    sys.exit(main())
