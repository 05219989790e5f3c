"""Tuned half precision on Hopper: BF16 and FP16 products nobody tuned, each tuned with the default
budget in a fresh cache, then what `autogemm.matmul` serves on PyTorch tensors timed sustained against
torch.matmul in the same run.

The problems come from a seeded generator (`half_problems`): LLM projections (M tokens from 128 to
16384 against the qkv, output, gate-up and down widths of model families that campaigns/ does not
name), mostly NT (x @ W.T, as F.linear reads its weights), some NN and TN (weight gradients); squares
and near-squares; odd sizes; K from 1024 to 32768. None of them is a problem of campaigns/, cache/ or
the other benchmarks (bench_unseen.known_keys), and no width of a campaign is a model width here.

Each problem: `autogemm.tune` with the default options in a user cache of its own (the shipped results
on, as a new user has them; the compiled kernels are kept for the run, as a user's are after a first
tune: bench_common.keep_compiled_kernels), then autogemm.matmul and torch.matmul on the same tensors, checked against
float64 and timed three ways (autogemm/measure/timing.py):
- GPU time sustained, the headline ratio: GRAPH_CALLS back-to-back calls of each captured in a CUDA graph
  (as a compiled or graphed training step runs them), the graphs replayed in `sustained_times`' rounds
  (GPU_ROUNDS rounds of about 50 ms per competitor, in random order, the GPU never idle, clocks and power
  settled; means of the rounds). The host's time is not in it.
- Eager sustained: 20 such rounds of plain back-to-back calls. Where a product takes less GPU time than
  a Python call's host time (about 20 us on the reference host), this measures the host: such a loop
  is host-bound for torch.matmul and autogemm alike, and shows what autogemm's Python adds.
- One call at a time on an idle GPU (medians of 25, host time included).
The row has the tune's verdict, what serves, the served config's tiles and waves on the device's SMs,
the SM clock and power seen, and a digest of autogemm's sources (`source_digest`): a results file
filled over several runs holds rows of one code only, or --report says which differ.

With `--inductor N`, the first N problems run also compile `a @ b` with torch.compile(mode=
"max-autotune-no-cudagraphs") without and with autogemm among Inductor's choices
(`autogemm.torch.enable_inductor`), after the tune, and time the two sustained against each other.

Every finished problem is appended to a JSON lines file at once (`--out`, default
benchmarks/results/tuned-half-<device>[-seed<S>].jsonl), and a rerun with the same file skips the
problems it holds: a run cut short, or spread over several commands (`--shard I/N`), loses nothing.
`--report` writes the Markdown table from that file (benchmarks/results/..., same stem).

    python benchmarks/bench_tuned_half.py --list                 # the problems (no GPU needed)
    python benchmarks/bench_tuned_half.py --seed 7 --shard 1/3   # development: another draw, a third
    python benchmarks/bench_tuned_half.py --report               # the table of what has been run
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import (deadline_after, device_of, keep_compiled_kernels,  # noqa: E402
                          make_operands, problem_label, release_memory, results_arguments,
                          repository_files, require_rows_of_draw, results_path, run_rows, source_digest,
                          write_report)
from tuned_half_table import AUTOGEMM, GPU_ROUNDS, GRAPH_CALLS, TORCH, report  # noqa: E402

# 2030: seed 2027's draw (published on an earlier code, benchmarks/results/...-seed2027.md) shares problems, up to
# their dtype, with the rows the kernels were developed against since (its 256 x 9216 x 3072, 1000 x 2304 x 9216,
# 640 x 27648 x 5120 ...), so the tables are published from a draw nobody has looked at
SEED, COUNT = 2030, 40
# (hidden, qkv output, intermediate) of model families none of campaigns/ names: Qwen2.5 7B/14B/32B/72B,
# Phi-3-mini, Gemma-2 2B, Falcon-7B, Yi-34B, DeepSeek-V2-Lite
FAMILIES = {
    "qwen2.5-7b": (3584, 4608, 18944), "qwen2.5-14b": (5120, 7168, 13824), "qwen2.5-32b": (5120, 7168, 27648),
    "qwen2.5-72b": (8192, 10240, 29568), "phi-3-mini": (3072, 9216, 8192), "gemma-2-2b": (2304, 4096, 9216),
    "falcon-7b": (4544, 4672, 18176), "yi-34b": (7168, 9216, 20480), "deepseek-v2-lite": (2048, 3072, 10944),
}
TOKENS = [128, 200, 256, 333, 384, 512, 640, 768, 1000, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
K_RANGE = (1024, 32768)
MAX_FLOPS, MAX_BYTES = 8e12, 2e9  # one call: a few ms at most on an H200, and room for the tune's input sets


def _campaign_widths() -> set[int]:
    """Every N and K a campaign names: the widths of the model families that were tuned."""
    from autogemm.campaigns.file import load_campaign

    widths = set()
    for path in repository_files("campaigns", "*.toml"):
        for problem in load_campaign(path).problems:
            widths |= {problem.n, problem.k}
    return widths


def _projection(rng, tuned_widths):
    """A layer of a family: (layout, M, N, K), N x K the weight (NT), or its gradient's product."""
    family = rng.choice(sorted(FAMILIES))
    hidden, qkv, inter = FAMILIES[family]
    n, k = rng.choice([(qkv, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter), (inter, hidden)])
    if n in tuned_widths or k in tuned_widths:
        return None
    m = rng.choice(TOKENS)
    layout = rng.choices(["nt", "nn", "tn"], weights=[70, 15, 15])[0]
    if layout == "tn":  # a weight gradient: dW (N x K) = dY^T (N x M) @ X (M x K), the tokens are its K
        m, n, k = n, k, max(K_RANGE[0], m)
    return layout, m, n, k


def _log_int(rng, low, high) -> int:
    return max(low, min(high, round(math.exp(rng.uniform(math.log(low), math.log(high))))))


def _square(rng, tuned_widths):
    side = _log_int(rng, 1024, 8192)
    near = lambda: side + rng.randint(-9, 9) if rng.random() < 0.6 else side  # noqa: E731
    return rng.choices(["nt", "nn"], weights=[60, 40])[0], near(), near(), near()


def _odd(rng, tuned_widths):
    m, n = _log_int(rng, 128, 16384), _log_int(rng, 512, 16384)
    return rng.choices(["nt", "nn", "tn"], weights=[60, 25, 15])[0], m, n, _log_int(rng, *K_RANGE)


def half_problems(seed: int = SEED, count: int = COUNT) -> list[tuple]:
    """`count` spec tuples (dtype, layout, M, N, K), the same for a seed: half BF16, half FP16, none known
    (bench_unseen.known_keys), none twice, each within MAX_FLOPS and MAX_BYTES."""
    from autogemm.problem import Problem
    from bench_unseen import known_keys

    rng = random.Random(seed)
    seen, tuned_widths, out = known_keys(), _campaign_widths(), []
    while len(out) < count:
        dtype = ("bfloat16", "float16")[len(out) % 2]
        draw = rng.choices([_projection, _square, _odd], weights=[65, 15, 20])[0](rng, tuned_widths)
        if draw is None:
            continue
        layout, m, n, k = draw
        if not K_RANGE[0] <= k <= K_RANGE[1] or 2 * m * n * k > MAX_FLOPS or 2 * (m * k + k * n + m * n) > MAX_BYTES:
            continue
        key = Problem.from_layout(m, n, k, layout, dtype=dtype).key
        if key in seen:
            continue
        seen.add(key)
        out.append((dtype, layout, m, n, k))
    return out


def _problem(spec):
    from autogemm.problem import Problem

    dtype, layout, m, n, k = spec
    return Problem.from_layout(m, n, k, layout, dtype=dtype)


def _tensors(spec, seed: int):
    """A and B as a user holds them (bench_common.make_operands: values in [-1, 1], a transposed operand a
    transposed view), as PyTorch tensors on the same memory."""
    from autogemm.measure.baselines import as_torch

    dtype, layout, m, n, k = spec
    _, a, b = make_operands((dtype, "fp32", layout, 1, m, n, k), seed=seed)
    return as_torch(a), as_torch(b)


def measure(spec, index: int, inductor: bool = False) -> dict:
    """One problem: tuned in a cache of its own, then served and timed (module docstring)."""
    import torch

    import autogemm
    from autogemm.families.waves import fill
    from autogemm.gpu.launch import current_device
    from autogemm.measure import timing
    from autogemm.measure.clocks import ClockMonitor
    from autogemm.families import config_from_name

    problem, device = _problem(spec), current_device()
    cache_dir = tempfile.mkdtemp(prefix="autogemm-tuned-half-")
    os.environ["AUTOGEMM_CACHE_DIR"] = cache_dir  # (the tune and what serves after it read this cache)
    autogemm.reset()
    started = time.perf_counter()
    result = autogemm.tune(problem)
    tune_s = time.perf_counter() - started
    autogemm.reset()
    a, b = _tensors(spec, seed=2 * index + 1)
    calls = {AUTOGEMM: lambda i=0: autogemm.matmul(a, b), TORCH: lambda i=0: torch.matmul(a, b)}
    expected = a.double() @ b.double()
    for name, call in calls.items():
        for _ in range(20):  # as a user's loop: what serves an untuned problem may settle in its first calls
            got = call()
        torch.cuda.synchronize()
        error = float(torch.linalg.norm(got.double() - expected) / torch.linalg.norm(expected))
        if not error <= 2e-2:
            raise SystemExit(f"{problem_label(problem)}: {name} differs from float64 by {error:.3g}")
    del expected, got
    served = autogemm.explain(a, b)
    with ClockMonitor() as monitor:
        graphed = {name: _graphed(torch, call, expected_of=calls[TORCH]) for name, call in calls.items()}
        rounds = timing.sustained_times({name: lambda i, g=g: g.replay() for name, (g, _) in graphed.items()},
                                        rounds=GPU_ROUNDS)
    del graphed
    gpu_us = {name: statistics.fmean(times) * 1e3 / GRAPH_CALLS for name, times in rounds.items()}
    eager = timing.sustained_times(calls)
    sustained = {name: statistics.fmean(times) * 1e3 for name, times in eager.items()}
    latency = {name: statistics.median(times) * 1e3
               for name, times in timing.latencies(calls, rounds=25).items()}
    config = served["config"]
    waves = fill(config_from_name(config), problem, device).describe() if config else ""
    compiled = inductor_figures(a, b) if inductor else {}
    return {"index": index, "spec": list(spec), "problem": problem.key, "label": problem_label(problem),
            "source_digest": source_digest(), "kernels_kept": "AUTOGEMM_CUBIN_DIR" in os.environ,
            "source": served["source"], "config": config, "generated": config is not None, "waves": waves,
            "kept_cublas": result.kept_cublas, "tuned_config": result.config.name,
            "tuned_waves": fill(result.config, problem, device).describe(), "tune_ratio": result.ratio,
            "tune_noise": result.noise, "tune_sustained": result.sustained, "tune_s": tune_s,
            "gpu_us": gpu_us, "ratio": gpu_us[TORCH] / gpu_us[AUTOGEMM],
            "spread": {name: (max(t) - min(t)) / (2 * statistics.median(t)) for name, t in rounds.items()},
            # each GPU-time round's us a call, in the order run: a row whose two sides are one kernel (cuBLAS kept)
            # is an A/A test of the timing, and one slow round shows here, not only in the mean
            "gpu_rounds_us": {name: [round(ms * 1e3 / GRAPH_CALLS, 3) for ms in t] for name, t in rounds.items()},
            "sustained_us": sustained, "eager_ratio": sustained[TORCH] / sustained[AUTOGEMM],
            "latency_us": latency, "latency_ratio": latency[TORCH] / latency[AUTOGEMM],
            **monitor.figures(), **compiled}


def _graphed(torch, call, expected_of):
    """(graph, outputs): GRAPH_CALLS calls of `call` captured in one CUDA graph (warmed on a side stream
    first, as PyTorch's capture wants), replayed once and its last output checked against
    `expected_of()`'s, so that what is timed is the product itself."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = [call() for _ in range(GRAPH_CALLS)]
    outputs[-1].zero_()
    graph.replay()
    expected = expected_of()
    error = float(torch.linalg.norm(outputs[-1].double() - expected.double()) / torch.linalg.norm(expected.double()))
    if not error <= 2e-2:
        raise SystemExit(f"a CUDA graph of the call differs from torch.matmul by {error:.3g}")
    return graph, outputs


def inductor_figures(a, b) -> dict:
    """Issue 65's row: `a @ b` compiled with torch.compile(mode="max-autotune-no-cudagraphs") without and
    with autogemm among Inductor's choices (autogemm.torch.enable_inductor), each compiled afresh, timed
    sustained against each other in the same rounds; the ratio is without / with (> 1: autogemm's choice
    made the compiled product faster)."""
    import statistics

    import torch

    import autogemm.torch as autogemm_torch
    from autogemm.measure import timing

    def compiled():
        torch._dynamo.reset()
        function = torch.compile(lambda x, y: x @ y, mode="max-autotune-no-cudagraphs")
        function(a, b)  # (compiles and autotunes now, outside the timing)
        return function

    autogemm_torch.disable_inductor()
    without = compiled()
    autogemm_torch.enable_inductor()
    try:
        with_autogemm = compiled()
    finally:
        autogemm_torch.disable_inductor()
    rounds = timing.sustained_times({"max-autotune": lambda i: without(a, b),
                                     "max-autotune + autogemm": lambda i: with_autogemm(a, b)})
    us = {name: statistics.fmean(times) * 1e3 for name, times in rounds.items()}
    return {"inductor_us": us, "inductor_ratio": us["max-autotune"] / us["max-autotune + autogemm"]}


def _given(text: str, parser) -> tuple:
    """A --problem's spec (dtype, layout, M, N, K), or the parser's error naming what is wrong."""
    parts = text.split(",")
    try:
        dtype, layout, m, n, k = parts[0], parts[1], *(int(x) for x in parts[2:])
        if dtype not in ("bfloat16", "float16") or layout not in ("nn", "nt", "tn", "tt") or min(m, n, k) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--problem takes DTYPE,LAYOUT,M,N,K (bfloat16 or float16, a layout, three sizes >= 1), got {text!r}")
    return dtype, layout, m, n, k


def _out_path(args, device_slug: str) -> Path:
    if args.out:
        return Path(args.out)
    if args.problem:
        return results_path(f"tuned-half-{device_slug}-given").with_suffix(".jsonl")
    suffix = "" if args.seed == SEED else f"-seed{args.seed}"
    return results_path(f"tuned-half-{device_slug}{suffix}").with_suffix(".jsonl")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    results_arguments(parser, SEED, COUNT, "a problem takes about 55 s on an H200")
    parser.add_argument("--shard", default="1/1", help="I/N: only every N-th problem, starting with the I-th (default 1/1)")
    parser.add_argument("--only", help="only problems whose label contains one of these comma-separated texts")
    parser.add_argument("--problem", action="append", metavar="DTYPE,LAYOUT,M,N,K",
                        help="run this problem instead of the draw (repeatable; rows go to tuned-half-<device>-given.jsonl "
                             "unless --out), e.g. bfloat16,nt,8192,8192,8192")
    parser.add_argument("--inductor", type=int, default=0, metavar="N",
                        help="for the first N problems run, also a @ b under torch.compile(mode='max-autotune-no-cudagraphs') "
                             "without and with autogemm.torch.enable_inductor(), timed sustained (default 0: none)")
    args = parser.parse_args(argv)
    try:
        shard, shards = (int(x) for x in args.shard.split("/"))
        if not 1 <= shard <= shards:
            raise ValueError
    except ValueError:
        parser.error(f"--shard takes I/N with 1 <= I <= N, got {args.shard!r}")
    wanted = args.only.split(",") if args.only else None
    drawn = [_given(text, parser) for text in args.problem] if args.problem else half_problems(args.seed, args.count)
    specs = [(i, s) for i, s in enumerate(drawn)
             if i % shards == shard - 1 and (not wanted or any(t in problem_label(_problem(s)) for t in wanted))]
    if args.list:
        for index, spec in specs:
            print(f"#{index:<4d}{problem_label(_problem(spec)):<36} {_problem(spec).key}")
        return 0
    slug, name = device_of(args.device_slug if args.report else None)
    path = _out_path(args, slug)
    if not args.problem:  # (a file of given problems gathers the rows of several lists)
        require_rows_of_draw(path, drawn)
    if args.report:
        return write_report(path, lambda rows: report(rows, name, args.seed, len(specs)))
    ran = []

    def measured(spec, index):
        row = measure(spec, index, inductor=len(ran) < args.inductor)
        ran.append(index)
        release_memory()
        return row

    keep_compiled_kernels("autogemm-tuned-half-cubins-")
    run_rows(path, specs, lambda spec: _problem(spec).key, measured, deadline_after(args.deadline_s), lambda row: (
        f"#{row['index']:<4d}{row['label']:<34} ratio {row['ratio']:.3f}  eager {row['eager_ratio']:.3f}  "
        f"latency {row['latency_ratio']:.3f}  tune {row['tune_s']:.0f} s  {'cuBLAS kept' if row['kept_cublas'] else 'kernel'} "
        f"({row['tune_ratio']:.3f}x)  {row['waves'] or row['tuned_waves']}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
