"""`autogemm.matmul` against what a user would call instead, the faster of `torch.matmul` and
`cupy.matmul` (each on the same memory), over the public shape suite (benchmarks/shapes.toml), in one
run and timed the same way (autogemm/measure/timing.py): latency, each call on an idle GPU with its host
time, the competitors taking turns (median); and GPU time in steady state, each competitor's calls
back to back behind the gate for at least 100 ms (median of samples). Ratios are the faster
baseline's figure over autogemm's (> 1: autogemm is faster). Ways of meeting a shape:

    empty     nothing tuned by the user (an empty user cache; tuned results shipped for this GPU in
              cache/ are read, as a new user's matmul reads them)
    shipped   the same, refused unless cache/ ships a document for this GPU (what the shipped
              results are worth: issue 18's acceptance)
    tuned     each problem of the suite tuned first (--budget seconds each), then measured
    loo       leave-one-out: each shape measured with every other shape's tuned record but its
              own (the prediction at work); needs a cache of tuned records (--from, as `tuned`
              leaves it)

Writes benchmarks/results/shapes-<device>-<mode>.md (and .json): per-shape rows, geomeans per dtype.

    python benchmarks/bench_shapes.py empty
    python benchmarks/bench_shapes.py tuned --budget 30 --keep-cache /tmp/suite-cache
    python benchmarks/bench_shapes.py tuned --from /tmp/suite-cache      # measure only, with those records
    python benchmarks/bench_shapes.py loo --from /tmp/suite-cache
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SUITE_COMPUTE = {"float32": ("float32", "fp32"), "tf32": ("float32", "tf32"), "float16": ("float16", "fp32"),
                 "bfloat16": ("bfloat16", "fp32"), "float64": ("float64", "fp64")}


def load_suite(path: Path):
    from autogemm.problem import Problem

    data = tomllib.loads(path.read_text())
    unknown = set(data) - set(SUITE_COMPUTE)
    if unknown:
        raise SystemExit(f"{path}: unknown suite keys {sorted(unknown)}; use {sorted(SUITE_COMPUTE)}")
    problems = []
    for key, shapes in data.items():
        dtype, compute = SUITE_COMPUTE[key]
        for shape in shapes:
            if len(shape) != 3 or not all(type(x) is int and x > 0 for x in shape):
                raise SystemExit(f"{path}: {key}: a shape is [M, N, K] of positive integers, got {shape!r}")
            problems.append(Problem(*shape, dtype=dtype, compute=compute))
    return problems


def operands(problem, seed: int):
    from autogemm.measure.bench import random_uniform

    dtype = problem.dtype
    a = random_uniform((problem.m, problem.k), dtype, seed=seed)
    b = random_uniform((problem.k, problem.n), dtype, seed=seed + 1)
    if dtype == "bfloat16":  # users hold bfloat16 as ml_dtypes arrays; autogemm takes them zero-copy
        import ml_dtypes

        a, b = a.view(ml_dtypes.bfloat16), b.view(ml_dtypes.bfloat16)
    return a, b


def measure(problem, pairs: int, seed: int) -> dict:
    import autogemm
    from autogemm.measure import baselines

    if problem.compute == "tf32" and not baselines.cupy_in_tf32():
        return measure_in_tf32_process(problem, pairs, seed)
    a, b = operands(problem, seed)
    compute = problem.compute if problem.compute == "tf32" else None
    ours = lambda: autogemm.matmul(a, b, compute=compute)  # noqa: E731
    calls = {"autogemm.matmul": ours, **baselines.user_calls(a, b, problem.compute)}
    check(problem, ours(), calls[baselines.CUPY_MATMUL]() if baselines.CUPY_MATMUL in calls else a @ b)
    for _ in range(20):  # plans, compilation, clocks; a guarded kernel decides in its first calls
        ours()
    import cupy

    cupy.cuda.Device().synchronize()
    ours()
    explained = autogemm.explain(a, b, compute=compute)
    figures = baselines.measure(calls, latency_calls=pairs)
    gpu, latency, gpu_name, latency_name = baselines.faster_baseline(figures)
    mine = figures["autogemm.matmul"]
    return {"problem": problem.key, "dtype": problem.dtype, "compute": problem.compute,
            "shape": [problem.m, problem.n, problem.k], "ratio": latency / mine.latency_us,
            "gpu_ratio": gpu / mine.gpu_us, "faster_latency": latency_name, "faster_gpu": gpu_name,
            "figures": {name: {"gpu_us": f.gpu_us, "latency_us": f.latency_us} for name, f in figures.items()},
            "tflops": problem.flops / mine.gpu_us / 1e6, "source": explained["source"],
            "config": explained["config"], "reason": explained["reason"]}


def measure_in_tf32_process(problem, pairs: int, seed: int) -> dict:
    """`measure` in a child process where both baselines compute float32 in TF32 (CuPy's switch,
    CUPY_TF32=1, is read once when CuPy is imported; the child inherits the cache directory)."""
    import subprocess

    from autogemm.measure import baselines

    child = subprocess.run([sys.executable, __file__, "--measure-one", problem.key, "--pairs", str(pairs),
                            "--seed", str(seed)], env={**os.environ, **baselines.tf32_environment()},
                           capture_output=True, text=True)
    if child.returncode != 0:
        raise SystemExit(f"{problem.key}: the TF32 measuring process failed:\n{child.stderr[-2000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def check(problem, mine, base) -> None:
    """A ratio of a wrong result means nothing: autogemm's product must agree with cupy.matmul's
    (to twice the dtype's verification tolerance)."""
    from autogemm.measure.bench import relative_error, to_float64, tolerance

    def values(x):
        return to_float64(x.view(np.uint16)) if problem.dtype == "bfloat16" else x

    error = relative_error(values(mine), to_float64(values(base)))
    if not error <= 2 * tolerance(problem):
        raise SystemExit(f"{problem.key}: autogemm.matmul's result differs from cupy.matmul's by {error:.3g} "
                         f"(tolerance {2 * tolerance(problem):g}); no timing of a wrong result")


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def write(rows: list[dict], mode: str, note: str) -> Path:
    from autogemm.gpu.launch import current_device

    device = current_device()
    out = HERE / "results" / f"shapes-{device.slug}-{mode}"
    out.parent.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(f"{row['dtype']}/{row['compute']}", []).append(row)
    lines = [f"# Shape suite on {device.name}: {mode}", "", note, "",
             "Figures in us, latency / GPU time. Ratios: the faster of torch.matmul and cupy.matmul over autogemm "
             "(> 1: autogemm is faster), in latency and in steady-state GPU time.", "",
             "| problem | autogemm | torch.matmul | cupy.matmul | latency ratio | GPU ratio | served by |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        f = row["figures"]
        cell = lambda n: f"{f[n]['latency_us']:.1f} / {f[n]['gpu_us']:.1f}" if n in f else "-"  # noqa: E731
        served = row["config"] or row["source"]
        lines.append(f"| {row['problem']} | {cell('autogemm.matmul')} | {cell('torch.matmul')} | {cell('cupy.matmul')} | "
                     f"{row['ratio']:.3f} | {row['gpu_ratio']:.3f} | {row['source']}: {served} |")
    lines += ["", "| dtype | shapes | latency geomean | latency min | GPU geomean | GPU min |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for group, members in list(groups.items()) + [("all", rows)]:
        latency, gpu = [r["ratio"] for r in members], [r["gpu_ratio"] for r in members]
        lines.append(f"| {group} | {len(members)} | {geomean(latency):.3f} | {min(latency):.3f} | {geomean(gpu):.3f} | "
                     f"{min(gpu):.3f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"mode": mode, "note": note, "device": device.name, "rows": rows},
                                                   indent=1))
    print("\n".join(lines))
    return out.with_suffix(".md")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("mode", choices=("empty", "shipped", "tuned", "loo"), nargs="?")
    parser.add_argument("--suite", type=Path, default=HERE / "shapes.toml")
    parser.add_argument("--pairs", type=int, default=40, help="timed single calls of each competitor per shape "
                        "(latency: the median; default 40)")
    parser.add_argument("--budget", type=float, default=30.0, help="tuned: seconds of tuning per problem")
    parser.add_argument("--keep-cache", type=Path, help="tuned: keep the tuned cache in this directory")
    parser.add_argument("--from", dest="source", type=Path,
                        help="loo: the cache directory a `tuned` run kept; tuned: measure with it, tune nothing")
    parser.add_argument("--only", help="only problems whose key contains one of these comma-separated texts")
    parser.add_argument("--measure-one", metavar="KEY", help=argparse.SUPPRESS)  # measure_in_tf32_process's child
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode is None and not args.measure_one:
        parser.error("give a mode: empty, shipped, tuned or loo")
    if args.measure_one:  # (the mode is the parent's; the child only measures)
        from autogemm.problem import Problem

        print(json.dumps(measure(Problem.from_key(args.measure_one), args.pairs, args.seed)))
        return 0
    if args.pairs < 1:
        parser.error("--pairs must be >= 1")
    wanted = args.only.split(",") if args.only else [""]
    problems = [p for p in load_suite(args.suite) if any(text in p.key for text in wanted)]

    import autogemm
    from autogemm.results.cache import TuningCache
    from autogemm.gpu.launch import current_device

    device = current_device()
    rows = []
    if args.mode in ("empty", "shipped"):
        os.environ["AUTOGEMM_CACHE_DIR"] = tempfile.mkdtemp(prefix="autogemm-empty-")
        shipped = TuningCache().records(device.slug, include_shipped=True)
        if args.mode == "shipped" and not shipped:
            raise SystemExit(f"no tuned results are shipped for {device.slug} (cache/{device.slug}.json)")
        for i, problem in enumerate(problems):
            rows.append(measure(problem, args.pairs, seed=10 * i))
        note = (f"An empty user cache, with the {len(shipped)} records shipped for this GPU in cache/; "
                f"{args.pairs} single calls of each competitor per shape (each on an idle GPU, taking turns).")
    elif args.mode == "tuned" and args.source is not None:
        os.environ["AUTOGEMM_CACHE_DIR"] = str(args.source)
        autogemm.reset()
        for i, problem in enumerate(problems):
            rows.append(measure(problem, args.pairs, seed=10 * i))
        note = (f"With the tuned records of an earlier `tuned` run (each problem tuned with a {args.budget:g} s search "
                f"budget, re-timing on top); {args.pairs} single calls of each competitor per shape (each on an idle GPU, taking turns).")
    elif args.mode == "tuned":
        directory = args.keep_cache or Path(tempfile.mkdtemp(prefix="autogemm-tuned-"))
        os.environ["AUTOGEMM_CACHE_DIR"] = str(directory)
        started = time.perf_counter()
        for problem in problems:
            result = autogemm.tune(problem, trials=10_000, timeout=args.budget)
            print(f"tuned {problem.key}: {'cuBLAS kept' if result.kept_cublas else result.config.name} "
                  f"({result.ratio:.3f}x, {result.wall_s:.1f} s)", file=sys.stderr)
        autogemm.reset()
        for i, problem in enumerate(problems):
            rows.append(measure(problem, args.pairs, seed=10 * i))
        note = (f"Each problem tuned first with a {args.budget:g} s budget (search; re-timing on top), "
                f"{time.perf_counter() - started:.0f} s in all; {args.pairs} single calls of each competitor per shape (each on an idle GPU, taking turns).")
    else:
        if args.source is None:
            parser.error("loo needs --from DIR, the cache a `tuned` run kept")
        tuned = TuningCache(args.source, shipped=False)
        records = tuned.records(device.slug, include_shipped=False)
        for i, problem in enumerate(problems):
            directory = Path(tempfile.mkdtemp(prefix="autogemm-loo-"))
            cache = TuningCache(directory, shipped=False)
            for _, record in records:
                if record.problem != problem.key:
                    cache.store(record, device.slug, keep_better=False)
            os.environ["AUTOGEMM_CACHE_DIR"] = str(directory)
            autogemm.reset()
            rows.append(measure(problem, args.pairs, seed=10 * i))
        note = (f"Leave-one-out: each shape with every tuned record of a `tuned` run but its own; {args.pairs} "
                "single calls of each competitor per shape (each on an idle GPU, taking turns).")
    write(rows, args.mode, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
