"""`autogemm.matmul` on PyTorch tensors against `torch.matmul` on the same tensors, by single-call
latency (issue 37): over the unseen-shape suite (bench_unseen.unseen_problems, seed 2026: shapes
nobody tuned) and the public suite of shapes.toml (where the shipped results of cache/ apply), plus
host time per call at 64^3 and 256^3 of autogemm on tensors, torch.matmul, autogemm on CuPy arrays of
the same memory and cupy.matmul.

Each problem: the operands are made as a user holds them (transposed views, batches; bench_common),
shared with PyTorch without a copy; autogemm's result on the tensors is checked against torch.matmul's
(a wrong result ends the run), autogemm is warmed up as a loop would (16 calls, a synchronization,
4 more: a plan settles within its first calls), then both are timed by latency (autogemm/measure/timing.py:
each call on an idle GPU, host time included, in an order drawn afresh each round; medians). Ratio =
torch.matmul's latency / autogemm's (> 1: autogemm is faster). TF32 problems run with
torch.backends.cuda.matmul.allow_tf32 on and autogemm's compute="tf32". Host time: calls back to back,
synchronized every 100 (host_time.per_call_us), best of three runs.

An empty user cache (a fresh AUTOGEMM_CACHE_DIR) with the shipped results on: what a new user meets.
Writes benchmarks/results/torch-<device>.md (and .json).

    python benchmarks/bench_torch.py
    python benchmarks/bench_torch.py --count 40 --rounds 10    # a quick look (its own file name)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import geomean, make_operands, percentile, problem_label, release_memory, results_path  # noqa: E402
from bench_unseen import COUNT, SEED, mode_name, unseen_problems  # noqa: E402
from host_time import per_call_us  # noqa: E402

AUTOGEMM, TORCH = "autogemm.matmul", "torch.matmul"
ROUNDS = 25
GPU_TIME_MS = 6.0
HOST_SIZES = (64, 256)
HOST_DTYPES = ("float32", "float16")
MODE_ORDER = ("float16", "bfloat16", "float32", "tf32", "float64")


def public_specs(suite: Path) -> list[tuple]:
    """The problems of the public suite (shapes.toml) as bench specs (NN, no batch)."""
    from bench_shapes import load_suite

    return [(p.dtype, p.compute, "nn", 1, p.m, p.n, p.k) for p in load_suite(suite)]


def measure(spec, rounds: int, seed: int, gpu_time_ms: float = 0.0) -> dict:
    import torch

    import autogemm
    from autogemm.measure.baselines import as_torch
    from autogemm.measure.bench import tolerance

    problem, a, b = make_operands(spec, seed=seed)
    ta, tb = as_torch(a), as_torch(b)
    tf32 = problem.compute == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    compute = "tf32" if tf32 else None
    calls = {AUTOGEMM: lambda: autogemm.matmul(ta, tb, compute=compute), TORCH: lambda: torch.matmul(ta, tb)}

    def error() -> float:
        mine, theirs = calls[AUTOGEMM]().double(), calls[TORCH]().double()
        return float(torch.linalg.norm(mine - theirs) / max(float(torch.linalg.norm(theirs)), 1e-300))

    limit = 2 * tolerance(problem)
    first = error()
    for calls_now in (16, 4):
        for _ in range(calls_now):
            calls[AUTOGEMM]()
        torch.cuda.synchronize()
    worst = max(first, error())
    if not worst <= limit:
        raise SystemExit(f"{problem_label(problem)} ({problem.key}): autogemm on tensors differs from torch.matmul "
                         f"by {worst:.3g} (limit {limit:.3g})")
    served = autogemm.explain(ta, tb, compute=compute)
    from autogemm.measure import timing

    latency = {name: statistics.median(values) * 1e3 for name, values in timing.latencies(calls, rounds=rounds).items()}
    row = {"spec": list(spec), "problem": problem.key, "label": problem_label(problem), "mode": mode_name(spec),
           "source": served["source"], "config": served["config"], "error": worst, "latency_us": latency,
           "ratio": latency[TORCH] / latency[AUTOGEMM]}
    if gpu_time_ms > 0:  # where a loss comes from: the kernel (GPU time) or what comes before the launch
        gpu = {name: timing.gpu_time(lambda i, call=call: call(), target_ms=gpu_time_ms).us for name, call in calls.items()}
        row.update(gpu_us=gpu, gpu_ratio=gpu[TORCH] / gpu[AUTOGEMM])
    return row


def host_times(calls: int) -> list[dict]:
    """Host time per call of autogemm on tensors and on CuPy arrays of the same memory, torch.matmul
    and cupy.matmul, on squares small enough that the GPU keeps up with the host."""
    import cupy
    import torch

    import autogemm

    rows = []
    for dtype in HOST_DTYPES:
        for n in HOST_SIZES:
            torch.backends.cuda.matmul.allow_tf32 = False
            ta = (torch.rand(n, n, device="cuda") * 2 - 1).to(getattr(torch, dtype))
            tb = (torch.rand(n, n, device="cuda") * 2 - 1).to(getattr(torch, dtype))
            ca, cb = cupy.from_dlpack(ta), cupy.from_dlpack(tb)
            pieces = {"autogemm on tensors": lambda: autogemm.matmul(ta, tb), TORCH: lambda: torch.matmul(ta, tb),
                      "autogemm on CuPy arrays": lambda: autogemm.matmul(ca, cb),
                      "cupy.matmul": lambda: cupy.matmul(ca, cb)}
            us = {name: per_call_us(call, calls=calls, sync=torch.cuda.synchronize) for name, call in pieces.items()}
            rows.append({"dtype": dtype, "n": n, "host_us": us})
            print(f"host time {dtype} {n}^3: " + "  ".join(f"{k} {v:.2f}" for k, v in us.items()), flush=True)
    return rows


def summary(rows, title: str) -> list[str]:
    lines = [f"| {title} | problems | latency geomean | 5th percentile | min | GPU time geomean | GPU min | "
             "generated kernel |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    groups = [(mode, [r for r in rows if r["mode"] == mode]) for mode in MODE_ORDER]
    for name, group in groups + [("all", rows)]:
        if group:
            ratios = [r["ratio"] for r in group]
            gpu = [r["gpu_ratio"] for r in group if "gpu_ratio" in r]
            gpu_cells = f"{geomean(gpu):.3f} | {min(gpu):.3f}" if gpu else "- | -"
            lines.append(f"| {name} | {len(group)} | {geomean(ratios):.3f} | {percentile(ratios, 0.05):.3f} | "
                         f"{min(ratios):.3f} | {gpu_cells} | {sum(r['config'] is not None for r in group)} |")
    return lines


def report(suites: dict, hosts: list[dict], device, args) -> list[str]:
    import torch

    lines = [f"# autogemm.matmul on PyTorch tensors against torch.matmul: {device.name}", "",
             f"torch {torch.__version__}. Written by benchmarks/bench_torch.py. An empty user cache, the shipped "
             f"results of cache/ on. Latency: median of {args.rounds} single calls, each on an idle GPU, host time "
             "included, the two in an order drawn afresh each round, after 20 warm-up calls of autogemm.matmul. "
             "Ratio = torch.matmul's latency / autogemm's on the same tensors (> 1: autogemm is faster).", ""]
    for name, rows in suites.items():
        lines += summary(rows, name) + [""]
    if hosts:
        lines += ["Host time per call (us; calls back to back, synchronized every 100):", "",
                  "| dtype | size | autogemm on tensors | torch.matmul | autogemm on CuPy arrays | cupy.matmul | "
                  "CuPy path / cupy.matmul |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for row in hosts:
            us = row["host_us"]
            lines.append(f"| {row['dtype']} | {row['n']}^3 | {us['autogemm on tensors']:.2f} | {us[TORCH]:.2f} | "
                         f"{us['autogemm on CuPy arrays']:.2f} | {us['cupy.matmul']:.2f} | "
                         f"{us['autogemm on CuPy arrays'] / us['cupy.matmul']:.3f} |")
        lines.append("")
    for name, rows in suites.items():
        lines += [f"## {name}", "", "Latency and GPU time in us (GPU time: steady state, back-to-back calls).", "",
                  "| problem | autogemm latency | torch latency | ratio | autogemm GPU | torch GPU | GPU ratio | served by |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for row in sorted(rows, key=lambda r: r["ratio"]):
            us, gpu = row["latency_us"], row.get("gpu_us", {})
            served = row["source"] + (f": {row['config']}" if row["config"] else "")
            gpu_cells = (f"{gpu[AUTOGEMM]:.1f} | {gpu[TORCH]:.1f} | {row['gpu_ratio']:.3f}" if gpu else "- | - | -")
            lines.append(f"| {row['label']} | {us[AUTOGEMM]:.1f} | {us[TORCH]:.1f} | {row['ratio']:.3f} | {gpu_cells} | "
                         f"{served} |")
        lines.append("")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=SEED, help=f"the unseen suite's seed (default {SEED})")
    parser.add_argument("--count", type=int, default=COUNT, help=f"unseen problems (default {COUNT})")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"latency calls per competitor (default {ROUNDS})")
    parser.add_argument("--suite", type=Path, default=HERE / "shapes.toml", help="the public suite")
    parser.add_argument("--host-calls", type=int, default=3000, help="calls per host-time run (default 3000)")
    parser.add_argument("--gpu-time-ms", type=float, default=GPU_TIME_MS,
                        help=f"GPU time in steady state, this many ms per competitor and problem (default {GPU_TIME_MS:g}; "
                             "0: off)")
    args = parser.parse_args(argv)
    os.environ["AUTOGEMM_CACHE_DIR"] = tempfile.mkdtemp(prefix="autogemm-torch-")  # before autogemm is imported
    import torch

    from autogemm.gpu.launch import current_device

    if not torch.cuda.is_available():
        raise SystemExit("bench_torch needs PyTorch with CUDA")
    suites = {}
    for name, specs in ((f"unseen (seed {args.seed}, {args.count} problems)", unseen_problems(args.seed, args.count)),
                        (f"public suite ({args.suite.name}, shipped results)", public_specs(args.suite))):
        rows = []
        for index, spec in enumerate(specs):
            row = measure(tuple(spec), args.rounds, seed=2 * index, gpu_time_ms=args.gpu_time_ms)
            rows.append(row)
            us = row["latency_us"]
            print(f"#{index:<4d}{row['label']:<36} ratio {row['ratio']:.3f}  autogemm {us[AUTOGEMM]:.1f}  "
                  f"torch {us[TORCH]:.1f} us  [{row['source']}{': ' + row['config'] if row['config'] else ''}]",
                  flush=True)
            release_memory()  # (sizes vary a lot)
        suites[name] = rows
        print("\n".join(summary(rows, name)), flush=True)
    # host time last, in a process long warmed up (the first pieces timed in a fresh one ran up to 1.3x slower)
    hosts = host_times(args.host_calls)
    device = current_device()
    published = (args.seed, args.count, args.rounds, args.gpu_time_ms) == (SEED, COUNT, ROUNDS, GPU_TIME_MS)
    path = results_path(f"torch-{device.slug}" + ("" if published else f"-seed{args.seed}-n{args.count}"))
    path.with_suffix(".md").write_text("\n".join(report(suites, hosts, device, args)) + "\n")
    path.with_suffix(".json").write_text(json.dumps({"device": device.name, "seed": args.seed, "count": args.count,
                                                     "rounds": args.rounds, "gpu_time_ms": args.gpu_time_ms,
                                                     "host": hosts, "suites": suites}, indent=1))
    print(f"written: {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
