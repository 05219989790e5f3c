"""`autogemm.matmul` on shapes nobody tuned, against what a user would call instead: the faster of
torch.matmul and cupy.matmul, by single-call latency.

The problems come from a seeded generator (`unseen_problems`): LLM projections and decode products
(M tokens against real model widths, FP16 and BF16 mostly, NN, NT and some TN), squares and
near-squares, skinny and odd shapes (one row, one column, primes, K from 16 to 32768), and batched
products (attention-like), in every dtype and compute mode (float32, float32 in TF32, float16,
bfloat16, float64; at least 25 problems each). None of them is a problem anything shipped was tuned
or benchmarked on (`known_keys`: the entries of cache/*.json, the problems of campaigns/*.toml,
benchmarks/shapes.toml and bench_baselines.SHAPES); a draw among them is drawn again. One call stays
short: at most 2e11 flops in float32 and float64, 2e12 on tensor cores, 1.5 GB of A, B and C.

Each problem: autogemm's result is checked against cupy.matmul's (a wrong result ends the run: no
timing of a wrong result), then autogemm.matmul is warmed up as a user's loop would (16 calls, a
synchronization, 4 more: the kernel served to an untuned problem may be settled within its first
calls) and checked again, `autogemm.explain` says what serves it, and the competitors are timed by
latency (autogemm/measure/timing.py: each call on an idle GPU, host time included, competitors in an order
drawn afresh each round; medians). Ratio = faster baseline latency / autogemm latency (> 1: autogemm is faster).
--gpu-time-ms adds GPU time in steady state (timing.gpu_time); --sustained [ROUNDS] adds sustained GPU time
(timing.sustained_times, ROUNDS rounds: 20 unless given) of the problems whose faster baseline takes 50 us or
more, on the CuPy arrays and on torch views of them (the tensor path against torch.matmul). TF32 problems run
in one child process started with CUPY_TF32=1 (baselines.tf32_environment), where torch and cupy compute in
TF32.

The run uses an empty user cache (a fresh AUTOGEMM_CACHE_DIR unless --cache-dir) with the shipped
results of cache/ on: what a new user meets. Writes benchmarks/results/unseen-<device>.md (and
.json); a run with another seed, count or --only adds them to the name.

    python benchmarks/bench_unseen.py                  # the published table (seed 2026)
    python benchmarks/bench_unseen.py --seed 7         # development: another draw
    python benchmarks/bench_unseen.py --sustained --rows unseen.jsonl --deadline-s 500
                                                       # the published table over several commands: each
                                                       # appends its rows; the last writes the tables
    python benchmarks/bench_unseen.py --list --only tf32
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import (deadline_after, geomean, make_operands, mixed_codes, percentile,  # noqa: E402
                          problem_label, read_rows, release_memory, repository_files, results_path, run_rows,
                          source_digest)

SEED, COUNT, ROUNDS = 2026, 240, 25
AUTOGEMM, TORCH, CUPY = "autogemm.matmul", "torch.matmul", "cupy.matmul"
AUTOGEMM_TENSORS = "autogemm.matmul (tensors)"  # the same product on torch views of the same memory
# --sustained times the problems whose faster baseline takes at least this much GPU time a call
SUSTAINED_FROM_US = 50.0
SUSTAINED_ROUNDS = 20  # (timing.SUSTAINED_ROUNDS: what a tune's final comparison takes)
# (dtype, compute) modes with their share of the problems
MODES = {("float16", "fp32"): 0.28, ("bfloat16", "fp32"): 0.28, ("float32", "fp32"): 0.15,
         ("float32", "tf32"): 0.15, ("float64", "fp64"): 0.14}
TOKENS = [1, 2, 3, 5, 8, 12, 17, 24, 32, 48, 77, 96, 128, 200, 333, 512, 768, 1000, 1536, 2048, 3000, 4096,
          6144, 8192]
WIDTHS = [1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192, 11008, 13824, 14336, 28672]
DEPTHS = WIDTHS + [16384, 32768]
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
CUDA_CORE_FLOPS, TENSOR_CORE_FLOPS, MAX_BYTES = 2e11, 2e12, 1.5e9


def _problem(spec):
    from autogemm.problem import Problem

    dtype, compute, layout, batch, m, n, k = spec
    return Problem.from_layout(m, n, k, layout, batch=batch, dtype=dtype, compute=compute)


def mode_name(spec) -> str:
    return "tf32" if spec[1] == "tf32" else spec[0]


def known_keys() -> set[str]:
    """Keys of every problem something shipped was tuned or benchmarked on."""
    from autogemm.campaigns.file import load_campaign
    from bench_baselines import SHAPES
    from bench_shapes import load_suite

    keys = set()
    for path in repository_files("cache", "*.json"):
        keys |= set(json.loads(path.read_text()).get("entries", {}))
    for path in repository_files("campaigns", "*.toml"):
        keys |= {problem.key for problem in load_campaign(path).problems}
    keys |= {problem.key for problem in load_suite(HERE / "shapes.toml")}
    return keys | {_problem(spec).key for spec in SHAPES}


def within_bounds(spec) -> bool:
    """One call stays short (flops) and fits easily (bytes of A, B and C)."""
    dtype, compute, _, batch, m, n, k = spec
    cuda_cores = (dtype, compute) in (("float32", "fp32"), ("float64", "fp64"))
    flops_ok = 2 * m * n * k * batch <= (CUDA_CORE_FLOPS if cuda_cores else TENSOR_CORE_FLOPS)
    return flops_ok and ITEMSIZE[dtype] * batch * (m * k + k * n + m * n) <= MAX_BYTES


def _log_int(rng, low, high) -> int:
    return max(low, min(high, round(math.exp(rng.uniform(math.log(low), math.log(high))))))


def _prime(rng, low, high) -> int:
    x = _log_int(rng, low, high)
    while x < 2 or any(x % d == 0 for d in range(2, math.isqrt(x) + 1)):
        x += 1
    return x


def _layout(rng) -> str:
    return rng.choices(["nn", "nt", "tn", "tt"], weights=[40, 25, 25, 10])[0]


def _llm(rng):
    """A projection or decode product: M tokens against a model's widths (NT: x @ W.T)."""
    m = rng.choice(TOKENS) if rng.random() < 0.75 else _log_int(rng, 1, 8192)
    return rng.choices(["nn", "nt", "tn"], weights=[45, 45, 10])[0], 1, m, rng.choice(WIDTHS), rng.choice(DEPTHS)


def _square(rng):
    side = _log_int(rng, 300, 6000)
    near = lambda: side + rng.randint(-5, 5) if rng.random() < 0.7 else side  # noqa: E731
    return _layout(rng), 1, near(), near(), near()


def _odd(rng):
    kind = rng.randrange(6)
    if kind == 0:  # one row
        m, n, k = 1, _log_int(rng, 16, 16384), _log_int(rng, 16, 32768)
    elif kind == 1:  # one column
        m, n, k = _log_int(rng, 16, 8192), 1, _log_int(rng, 16, 32768)
    elif kind == 2:  # primes
        m, n, k = _prime(rng, 2, 8000), _prime(rng, 2, 8000), _prime(rng, 17, 8000)
    elif kind == 3:  # short K
        m, n, k = _log_int(rng, 256, 8192), _log_int(rng, 256, 8192), _log_int(rng, 16, 64)
    elif kind == 4:  # long K
        m, n, k = _log_int(rng, 16, 1024), _log_int(rng, 16, 1024), _log_int(rng, 8192, 32768)
    else:  # tall and skinny, either way
        m, n, k = _log_int(rng, 2048, 8192), _log_int(rng, 2, 128), _log_int(rng, 64, 8192)
        m, n = (n, m) if rng.random() < 0.5 else (m, n)
    return _layout(rng), 1, m, n, k


def _batched(rng):
    batch = rng.choice([2, 3, 4, 8, 12, 16, 24, 32, 40, 48, 64])
    seq = lambda: rng.choice([128, 256, 384, 512, 1024]) if rng.random() < 0.6 else rng.randint(128, 1024)  # noqa: E731
    head = rng.choice([64, 80, 96, 128])
    kind = rng.randrange(3)
    if kind == 0:  # attention scores: Q @ K^T
        return "nt", batch, seq(), seq(), head
    if kind == 1:  # probabilities @ V
        return "nn", batch, seq(), head, seq()
    return _layout(rng), batch, _log_int(rng, 2, 2048), _log_int(rng, 2, 2048), _log_int(rng, 16, 4096)


def unseen_problems(seed: int = SEED, count: int = COUNT) -> list[tuple]:
    """`count` spec tuples (dtype, compute, layout, batch, M, N, K), the same for a seed; none known
    (`known_keys`), none twice, each within bounds."""
    rng = random.Random(seed)
    quotas = [int(share * count) for share in MODES.values()]
    quotas[0] += count - sum(quotas)
    modes = [mode for mode, quota in zip(MODES, quotas) for _ in range(quota)]
    rng.shuffle(modes)
    seen, out = known_keys(), []
    for dtype, compute in modes:
        weights = [50, 15, 20, 15] if dtype in ("float16", "bfloat16") else [25, 30, 30, 15]
        while True:
            draw = rng.choices([_llm, _square, _odd, _batched], weights=weights)[0]
            spec = (dtype, compute, *draw(rng))
            key = _problem(spec).key
            if key not in seen and within_bounds(spec):
                break
        seen.add(key)
        out.append(spec)
    return out


def _values(result, problem):
    from bench_baselines import _values as values  # PyTorch tensors and bfloat16 as float64 CuPy values

    return values(result, problem)


def faster_baseline_ratio(rounds: dict[str, list[float]], baselines, subject: str) -> float:
    """The faster baseline's time over `subject`'s, from per-round times (one figure a round each, the rounds
    shared), cross-fitted: the faster baseline is picked on the even rounds and the ratio taken on the odd
    ones, then the other way round; the geometric mean of the two. Picking and measuring on the same rounds
    would favour the baselines: the smaller of two noisy means lies below either baseline's own time, and a
    path that runs the same kernel as both would measure about 0.997 instead of 1 (a sustained mean's
    spread here is 0.3-0.5%)."""
    halves = (slice(0, None, 2), slice(1, None, 2))
    ratios = []
    for pick, measure in (halves, halves[::-1]):
        faster = min(baselines, key=lambda name: statistics.fmean(rounds[name][pick]))
        ratios.append(statistics.fmean(rounds[faster][measure]) / statistics.fmean(rounds[subject][measure]))
    return math.sqrt(ratios[0] * ratios[1])


def sustained_figures(calls: dict, a, b, compute, rounds: int = SUSTAINED_ROUNDS) -> dict:
    """Sustained GPU time (autogemm/measure/timing.py `sustained_times`: back to back, random-order rounds, the
    GPU never idle) of autogemm.matmul on the CuPy arrays and on torch views of them, torch.matmul and
    cupy.matmul; the ratio of each path to its baseline: the CuPy path against the faster of torch.matmul and
    cupy.matmul (`faster_baseline_ratio`), the tensor path against torch.matmul (what a PyTorch user calls)."""
    import autogemm
    from autogemm.measure import baselines, timing

    timed = {name: (lambda i, call=call: call()) for name, call in calls.items()}
    if TORCH in calls:
        ta, tb = baselines.as_torch(a), baselines.as_torch(b)
        timed[AUTOGEMM_TENSORS] = lambda i: autogemm.matmul(ta, tb, compute=compute)
    times = timing.sustained_times(timed, rounds=rounds)
    means = {name: statistics.fmean(per_round) * 1e3 for name, per_round in times.items()}
    out = {"sustained_us": means, "sustained_rounds": rounds,
           "sustained_ratio": faster_baseline_ratio(times, [n for n in (TORCH, CUPY) if n in times], AUTOGEMM)}
    if AUTOGEMM_TENSORS in means:
        out["sustained_tensor_ratio"] = means[TORCH] / means[AUTOGEMM_TENSORS]
    return out


def measure(spec, rounds: int = ROUNDS, gpu_time_ms: float = 0.0, seed: int = 0, sustained: int = 0) -> dict:
    """One problem: checked, warmed up, explained, timed (module docstring; `sustained`: its rounds, 0 for none)."""
    import cupy

    import autogemm
    from autogemm.measure import baselines, timing
    from autogemm.measure.bench import relative_error, tolerance

    problem, a, b = make_operands(spec, seed=seed)
    compute = problem.compute if problem.compute == "tf32" else None
    calls = {AUTOGEMM: lambda: autogemm.matmul(a, b, compute=compute), **baselines.user_calls(a, b, problem.compute)}
    reference = _values(calls[CUPY if CUPY in calls else TORCH](), problem)
    limit = 2 * tolerance(problem)

    def check(name, when=""):
        error = relative_error(_values(calls[name](), problem), reference)
        if not error <= limit:
            raise SystemExit(f"{problem_label(problem)} ({problem.key}): {name}{when} differs from cupy.matmul by "
                             f"{error:.3g} (limit {limit:.3g})")
        return error

    errors = {name: check(name) for name in calls if name != (CUPY if CUPY in calls else TORCH)}
    stream = cupy.cuda.get_current_stream()
    for calls_now in (16, 4):  # as a user's loop: lets autogemm settle what serves this problem
        for _ in range(calls_now):
            calls[AUTOGEMM]()
        stream.synchronize()
    errors[AUTOGEMM] = max(errors[AUTOGEMM], check(AUTOGEMM, " after warm-up"))
    reference = None  # (its memory back before the timing; check() is done with it)
    served = autogemm.explain(a, b, compute=compute)
    latency = {name: statistics.median(values) * 1e3
               for name, values in timing.latencies(calls, rounds=rounds).items()}
    faster = min((name for name in (TORCH, CUPY) if name in latency), key=latency.get)
    row = {"spec": list(spec), "problem": problem.key, "label": problem_label(problem), "mode": mode_name(spec),
           "source": served["source"], "config": served["config"], "reason": served["reason"],
           "generated": served["config"] is not None, "errors": errors, "latency_us": latency,
           "faster": faster, "ratio": latency[faster] / latency[AUTOGEMM]}
    if gpu_time_ms > 0:
        gpu = {name: timing.gpu_time(lambda i, call=call: call(), target_ms=gpu_time_ms).us
               for name, call in calls.items()}
        row.update(gpu_us=gpu, gpu_ratio=min(gpu[n] for n in (TORCH, CUPY) if n in gpu) / gpu[AUTOGEMM])
    if sustained:  # (a problem over SUSTAINED_FROM_US of GPU time: the faster baseline's, in a short gated run)
        baseline_us = [timing.gpu_time(lambda i, call=calls[n]: call(), target_ms=10.0).us for n in (TORCH, CUPY)
                       if n in calls]
        if min(baseline_us) >= SUSTAINED_FROM_US:
            row.update(sustained_figures(calls, a, b, compute, rounds=sustained))
    return row


def _progress(index: int, row: dict) -> str:
    us = row["latency_us"]
    theirs = "  ".join(f"{name.split('.')[0]} {us[name]:.1f}" for name in (TORCH, CUPY) if name in us)
    gpu = f"  gpu ratio {row['gpu_ratio']:.3f}" if "gpu_ratio" in row else ""
    if "sustained_ratio" in row:
        gpu += f"  sustained {row['sustained_ratio']:.3f}" + (
            f" (tensors {row['sustained_tensor_ratio']:.3f})" if "sustained_tensor_ratio" in row else "")
    return (f"#{index:<4d}{row['label']:<36} ratio {row['ratio']:.3f}{gpu}  autogemm {us[AUTOGEMM]:.1f}  {theirs} us"
            f"  [{row['source']}{': ' + row['config'] if row['config'] else ''}]")


def measure_all(indexed, rounds: int, gpu_time_ms: float, out=sys.stdout, sustained: int = 0,
                rows_file: Path | None = None, deadline: float = 0.0) -> list[dict]:
    """The rows of the problems `indexed` ((index, spec) pairs), through bench_common.run_rows: with
    `rows_file` (JSON lines) each row is appended to it at once and problems it holds already are skipped;
    none is started after `deadline` (time.time(); 0: no limit). Only the rows measured here are returned."""
    def measured(spec, index):
        row = {"index": index, "source_digest": source_digest(),
               **measure(tuple(spec), rounds, gpu_time_ms, seed=2 * index, sustained=sustained)}
        release_memory()
        return row

    return run_rows(rows_file, indexed, lambda spec: _problem(tuple(spec)).key, measured, deadline,
                    lambda row: _progress(row["index"], row), out=out)


def summary(rows) -> list[str]:
    """The per-dtype table, with an "all" row."""
    lines = ["| dtype/compute | problems | geomean | 5th percentile | min | generated kernel |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    groups = [(mode_name((d, c)), [r for r in rows if r["mode"] == mode_name((d, c))]) for d, c in MODES]
    for name, group in groups + [("all", rows)]:
        if group:
            ratios = [r["ratio"] for r in group]
            lines.append(f"| {name} | {len(group)} | {geomean(ratios):.3f} | {percentile(ratios, 0.05):.3f} | "
                         f"{min(ratios):.3f} | {sum(r['generated'] for r in group)} |")
    return lines


def sustained_summary(rows) -> list[str]:
    """Sustained GPU time of the problems that were timed so (--sustained): each path's ratio to its baseline."""
    timed = [r for r in rows if "sustained_ratio" in r]
    if not timed:
        return []
    tensors = [r["sustained_tensor_ratio"] for r in timed if "sustained_tensor_ratio" in r]
    rounds = sorted({r.get("sustained_rounds", SUSTAINED_ROUNDS) for r in timed})
    lines = [f"Sustained GPU time ({len(timed)} problems whose faster baseline takes {SUSTAINED_FROM_US:g} us of GPU time or more "
             f"a call; back to back in {'/'.join(map(str, rounds))} random-order rounds, the GPU never idle): the CuPy "
             "path against the faster of torch.matmul and cupy.matmul (picked on half the rounds, the ratio taken on "
             "the other half, both ways), the tensor path against torch.matmul.", "",
             "| path | problems | geomean | min |", "| --- | ---: | ---: | ---: |",
             f"| CuPy arrays | {len(timed)} | {geomean(r['sustained_ratio'] for r in timed):.3f} | "
             f"{min(r['sustained_ratio'] for r in timed):.3f} |"]
    if tensors:
        lines.append(f"| PyTorch tensors | {len(tensors)} | {geomean(tensors):.3f} | {min(tensors):.3f} |")
    return lines + [""]


def report(rows, device, args) -> list[str]:
    gpu = args.gpu_time_ms > 0
    lines = [f"# autogemm.matmul on unseen shapes: {device.name}", "", *mixed_codes(rows),
             f"{len(rows)} problems drawn by benchmarks/bench_unseen.py (seed {args.seed}, count {args.count}"
             f"{', only ' + args.only if args.only else ''}), none of them tuned or benchmarked before (cache/, "
             f"campaigns/, shapes.toml, bench_baselines). An empty user cache, the shipped results of cache/ on. "
             f"Latency: median of {args.rounds} single calls, each on an idle GPU, host time included, the "
             "competitors in an order drawn afresh each round, after 20 warm-up calls of autogemm.matmul. "
             "Ratio = latency of the faster of torch.matmul and cupy.matmul / latency of autogemm.matmul (> 1: autogemm is faster)"
             + (f"; GPU ratio likewise in GPU time (steady state, {args.gpu_time_ms:g} ms)." if gpu else "."), "",
             *summary(rows), "", *sustained_summary(rows),
             "| problem | autogemm us | torch us | cupy us | ratio |" + (" GPU ratio |" if gpu else "")
             + " served by |",
             "| --- | ---: | ---: | ---: | ---: |" + (" ---: |" if gpu else "") + " --- |"]
    for row in sorted(rows, key=lambda r: r["ratio"]):
        us = row["latency_us"]
        cell = lambda name: f"{us[name]:.1f}" if name in us else "-"  # noqa: E731
        served = row["source"] + (f": {row['config']}" if row["config"] else "")
        lines.append(f"| {row['label']} | {cell(AUTOGEMM)} | {cell(TORCH)} | {cell(CUPY)} | {row['ratio']:.3f} |"
                     + (f" {row['gpu_ratio']:.3f} |" if gpu else "") + f" {served} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=SEED,
                        help=f"seed of the problem generator (default {SEED}: the published table; develop with "
                             "another seed, e.g. 7, so that the published draw stays unseen)")
    parser.add_argument("--count", type=int, default=COUNT, help=f"problems drawn (default {COUNT})")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"latency calls per competitor (default {ROUNDS})")
    parser.add_argument("--gpu-time-ms", type=float, default=0.0,
                        help="also GPU time in steady state, this many ms per competitor and problem (default 0: off)")
    parser.add_argument("--sustained", type=int, nargs="?", const=SUSTAINED_ROUNDS, default=0, metavar="ROUNDS",
                        help=f"also sustained GPU time, on CuPy arrays and on tensors, for problems whose faster "
                             f"baseline takes {SUSTAINED_FROM_US:g} us of GPU time or more a call: ROUNDS rounds "
                             f"(default {SUSTAINED_ROUNDS}, about 5 s a problem; the spread of a mean falls as "
                             "their square root)")
    parser.add_argument("--only", help="only problems whose label contains one of these comma-separated texts")
    parser.add_argument("--list", action="store_true", help="print the problems and exit (no GPU needed)")
    parser.add_argument("--cache-dir", help="the user cache to use (default: a fresh, empty temporary directory)")
    parser.add_argument("--rows", type=Path,
                        help="a JSON lines file each problem's row is appended to as it is measured; problems it holds "
                             "are skipped, and the tables are written once it holds every problem of the draw (a run "
                             "spread over several commands with --deadline-s)")
    parser.add_argument("--deadline-s", type=float, default=0.0,
                        help="with --rows: start no problem after this many seconds (0: no limit)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # TF32 problems, specs on stdin
    parser.add_argument("--deadline-at", type=float, default=0.0, help=argparse.SUPPRESS)  # the child's (time.time())
    args = parser.parse_args(argv)
    if not 0 <= args.sustained <= 1000:
        parser.error(f"--sustained takes 1 to 1000 rounds (0: none), got {args.sustained}")
    if args.deadline_s and args.rows is None:
        parser.error("--deadline-s needs --rows (the file the problems measured so far are kept in)")
    if args.child:
        rows = measure_all(json.load(sys.stdin), args.rounds, args.gpu_time_ms, out=sys.stderr, sustained=args.sustained,
                           rows_file=args.rows, deadline=args.deadline_at)
        print(json.dumps(rows))
        return 0
    deadline = deadline_after(args.deadline_s)
    if not args.list:  # before anything of autogemm is imported: an empty user cache, the shipped results on
        os.environ["AUTOGEMM_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="autogemm-unseen-")
    wanted = args.only.split(",") if args.only else None
    specs = unseen_problems(args.seed, args.count)
    indexed = [(i, spec) for i, spec in enumerate(specs)
               if not wanted or any(text in problem_label(_problem(spec)) for text in wanted)]
    if args.list:
        for index, spec in indexed:
            print(f"#{index:<4d}{problem_label(_problem(spec)):<36} {_problem(spec).key}")
        return 0
    from autogemm.measure import baselines
    from autogemm.gpu.launch import current_device

    rows = measure_all([(i, s) for i, s in indexed if s[1] != "tf32"], args.rounds, args.gpu_time_ms,
                       sustained=args.sustained, rows_file=args.rows, deadline=deadline)
    tf32 = [(i, s) for i, s in indexed if s[1] == "tf32"]
    if tf32 and not (deadline and time.time() > deadline):
        command = [sys.executable, __file__, "--child", "--rounds", str(args.rounds),
                   "--gpu-time-ms", str(args.gpu_time_ms), *(["--sustained", str(args.sustained)] if args.sustained else []),
                   *(["--rows", str(args.rows), "--deadline-at", repr(deadline)] if args.rows is not None else [])]
        child = subprocess.run(command, input=json.dumps(tf32), stdout=subprocess.PIPE, text=True,
                               env={**os.environ, **baselines.tf32_environment()})
        if child.returncode:
            raise SystemExit(f"the TF32 process failed (exit status {child.returncode}; its messages above)")
        rows += json.loads(child.stdout.strip().splitlines()[-1])
    if args.rows is not None:  # the tables are of every problem of the draw, from the file
        wanted_indices = {i for i, _ in indexed}
        rows = [r for r in read_rows(args.rows) if r["index"] in wanted_indices]
        if {r["index"] for r in rows} != wanted_indices:
            print(f"{len(rows)} of {len(wanted_indices)} problems measured in {args.rows}: run the same command again "
                  "to go on (the tables are written once every problem is in)")
            return 0
    rows.sort(key=lambda r: r["index"])
    device = current_device()
    published = (args.seed, args.count, args.only) == (SEED, COUNT, None)
    stem = f"unseen-{device.slug}" + ("" if published else f"-seed{args.seed}-n{args.count}"
                                      + ("-only" if args.only else ""))
    path = results_path(stem)
    path.with_suffix(".md").write_text("\n".join(report(rows, device, args)) + "\n")
    path.with_suffix(".json").write_text(json.dumps(
        {"device": device.name, "seed": args.seed, "count": args.count, "rounds": args.rounds,
         "gpu_time_ms": args.gpu_time_ms, "sustained": args.sustained, "only": args.only, "rows": rows}, indent=1))
    print("\n".join(summary(rows)))
    print(f"written: {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
