"""Epilogue layers nobody tuned: `autogemm.linear` with a bias, GELU, SiLU or a residual, untuned and then
tuned with the default budget, against eager PyTorch, torch.compile and cuBLASLt's own epilogue.

The problems come from a seeded generator (`epilogue_problems`): a layer of a model family that none of
campaigns/ names (bench_tuned_half.FAMILIES; a draw with a width a campaign names is drawn again), M tokens
from 1 to 8192, one epilogue of bias, bias + GELU, bias + SiLU and residual, BF16 and FP16 in turn; none
whose key something shipped was tuned or benchmarked on (bench_unseen.known_keys). The layer is
y = act(x wᵀ + bias) or x wᵀ + residual: x M × K, w N × K (NT), as `torch.nn.Linear` holds them.

The competitors, on the same tensors:
- autogemm: `autogemm.linear(x, w, bias, activation=..., residual=...)`;
- eager: `F.linear(x, w, bias)` (cuBLASLt adds the bias inside its GEMM, as a PyTorch layer does), then
  `F.gelu` or `F.silu`; `F.linear(x, w) + residual`;
- torch.compile (default mode) of the eager layer, compiled for the problem's shapes (`dynamic=False`);
- cuBLASLt's own epilogue through nvmath-python where it has one (BIAS, GELU_BIAS, the residual as C with
  beta = 1). Its GELU is the tanh form: where it is, autogemm is also timed with "gelu_tanh", and the
  ratio to cuBLASLt compares the two on the same function;
- the GEMM alone, `F.linear(x, w)`: not a competitor but the ceiling. Eager's time over it is the ratio an
  epilogue that costs nothing on cuBLAS's GEMM would reach; the share of that gain autogemm captures is
  (eager - autogemm) / (eager - GEMM alone), judged where eager beats the GEMM alone by more than the rounds'
  noise (the rounds are kept in the row: `ceiling_noise`);
- eager again, one call at a time only, under a second name: eager against itself, how far a latency ratio
  moves with no difference between its two sides (the table's `latency_floor`).

Each problem twice, in a user cache of its own with the shipped results on (the compiled kernels kept for
the run, as a user's are after a first tune): untuned (what a new user meets), then after
`autogemm.tune(problem)` with the default budget. Each time, every competitor is checked against float64,
warmed up, and timed two ways: sustained (timing.sustained_times: back-to-back calls from Python in 20
rounds of about 50 ms per competitor, random order, the GPU never idle; means), where a product shorter than
a call's host time measures the host, as an eager loop meets it; and one call at a time on an idle GPU, host
time included (medians of LATENCY_ROUNDS, 200). Ratio = the competitor's time / autogemm's (> 1: autogemm is faster).
The single calls' ratios are also kept paired by round (`paired_latency`), for the noise of the two
estimators to be compared. The row also keeps the tune's own figures (`tune_figures`: its kernel's and
baselines' GPU times), so that the table can say whether a kept kernel serves as fast as its tune timed it.

Every finished problem is appended to a JSON lines file at once (`--out`, default
benchmarks/results/unseen-epilogues-<device>[-seed<S>-<count>].jsonl) with a digest of autogemm's sources; a
rerun skips the problems it holds, so a run cut short or spread over sessions (`--deadline-s`) loses
nothing. `--report` writes the Markdown table beside it. `--judged-first` measures the layers whose capture the
table judges (M of CAPTURE_FROM_M rows or more) before the others, so that the first slot of a draw reads them.

    python benchmarks/bench_unseen_epilogues.py --list              # the problems (no GPU needed)
    python benchmarks/bench_unseen_epilogues.py --seed 7 --count 6  # development: another draw
    python benchmarks/bench_unseen_epilogues.py --deadline-s 500    # the published draw, a slot at a time
    python benchmarks/bench_unseen_epilogues.py --judged-first --deadline-s 300   # its judged layers first
    python benchmarks/bench_unseen_epilogues.py --report
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import (build_linear_memo, case_epilogue, deadline_after, device_of, keep_compiled_kernels,  # noqa: E402
                          release_memory, results_arguments, results_path, require_rows_of_draw, run_rows,
                          source_digest, write_report)
from bench_epilogues import TOLERANCE, CublasLtLayer, relative_error  # noqa: E402
from bench_tuned_half import FAMILIES, _campaign_widths  # noqa: E402
from unseen_epilogues_table import (AUTOGEMM, AUTOGEMM_TANH, CAPTURE_FROM_M, COMPILED, CUBLASLT,  # noqa: E402
                                    EAGER, EAGER_AGAIN, GEMM_ALONE, LATENCY_ROUNDS, cell, ours_against, ratio,
                                    report, served_over_tuned)

SEED, COUNT = 7717, 24
CASES = ("bias", "bias+gelu", "bias+silu", "residual")
TOKENS = [1, 2, 4, 8, 16, 32, 77, 128, 200, 256, 333, 512, 640, 1000, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
MAX_FLOPS = 4e12  # one call: a few ms at most on an H200


def epilogue_problems(seed: int = SEED, count: int = COUNT) -> list[tuple]:
    """`count` spec tuples (dtype, case, M, N, K), the same for a seed: BF16 and FP16 in turn, the cases in
    turn (so that each has count // 4), none known, none twice, each within MAX_FLOPS."""
    from bench_unseen import known_keys

    rng = random.Random(seed)
    seen, tuned_widths, out = known_keys(), _campaign_widths(), []
    while len(out) < count:
        dtype, case = ("bfloat16", "float16")[len(out) % 2], CASES[(len(out) // 2) % len(CASES)]
        hidden, qkv, inter = FAMILIES[rng.choice(sorted(FAMILIES))]
        # a residual follows the layers that write the hidden state (attention's output, the MLP's down
        # projection); a bias and an activation the ones that widen it (qkv, the MLP's up projection)
        choices = [(hidden, hidden), (hidden, inter)] if case == "residual" else \
            [(qkv, hidden)] if case == "bias" else [(inter, hidden)]
        n, k = rng.choice(choices)
        m = rng.choice(TOKENS)
        if n in tuned_widths or k in tuned_widths or 2 * m * n * k > MAX_FLOPS:
            continue
        key = _problem((dtype, case, m, n, k)).key
        if key in seen:
            continue
        seen.add(key)
        out.append((dtype, case, m, n, k))
    return out


def draw_shortfalls(specs: list[tuple]) -> list[str]:
    """What a draw lacks of the suite issue 63 asks for (M from 1 to 8192: a layer of fewer than 16 rows, one of
    4096 or more, and four at least where the share captured is judged); empty where it has it all. A seed is
    only known to meet it once drawn, so the bench refuses to time a publication that would not."""
    ms = [spec[2] for spec in specs]
    lacking = []
    if min(ms) >= 16:
        lacking.append(f"no layer of fewer than 16 rows (the fewest: {min(ms)})")
    if max(ms) < 4096:
        lacking.append(f"no layer of 4096 rows or more (the most: {max(ms)})")
    judged = sum(m >= CAPTURE_FROM_M for m in ms)
    if judged < 4:
        lacking.append(f"{judged} layers of {CAPTURE_FROM_M} rows or more, where 4 are needed")
    return lacking


def _problem(spec):
    from autogemm.problem import Problem

    dtype, case, m, n, k = spec
    return Problem.from_layout(m, n, k, "nt", dtype=dtype, epilogue=case_epilogue(case))


def label(spec) -> str:
    dtype, case, m, n, k = spec
    return f"{dtype} {case} {m}x{n}x{k}"


def eager_layer(case: str):
    """The layer as eager PyTorch runs it."""
    import torch.nn.functional as F

    if case == "residual":
        return lambda x, w, bias, residual: F.linear(x, w) + residual
    activation = {"bias": None, "bias+gelu": F.gelu, "bias+silu": F.silu}[case]
    if activation is None:
        return lambda x, w, bias, residual: F.linear(x, w, bias)
    return lambda x, w, bias, residual: activation(F.linear(x, w, bias))


def autogemm_layer(case: str, gelu: str = "gelu"):
    import autogemm

    if case == "residual":
        return lambda x, w, bias, residual: autogemm.linear(x, w, residual=residual)
    activation = {"bias": None, "bias+gelu": gelu, "bias+silu": "silu"}[case]
    return lambda x, w, bias, residual: autogemm.linear(x, w, bias, activation=activation)


def reference(case: str, x, w, bias, residual, gelu: str = "gelu"):
    """The layer in float64."""
    import torch.nn.functional as F

    y = x.double() @ w.double().T
    if case == "residual":
        return y + residual.double()
    y = y + bias.double()
    if case == "bias+silu":
        return F.silu(y)
    if case == "bias+gelu":
        return F.gelu(y, approximate="tanh" if gelu == "gelu_tanh" else "none")
    return y


def _tensors(spec, seed: int):
    import torch

    dtype, case, m, n, k = spec
    torch_dtype = getattr(torch, dtype)
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", dtype=torch_dtype, generator=generator)
    w = (torch.randn(n, k, device="cuda", dtype=torch_dtype, generator=generator) / k ** 0.5).to(torch_dtype)
    bias = torch.randn(n, device="cuda", dtype=torch_dtype, generator=generator)
    residual = torch.randn(m, n, device="cuda", dtype=torch_dtype, generator=generator)
    return x, w, bias, residual


def _checked(name: str, call, expected, dtype: str, what: str):
    """`call`, after its result was checked against `expected` (a wrong result ends the run)."""
    error = relative_error(call(), expected)
    if not error <= TOLERANCE[dtype]:
        raise SystemExit(f"{what}: {name} differs from float64 by {error:.3g} (limit {TOLERANCE[dtype]:g})")
    return call


def compiled_layer(case: str, args):
    """torch.compile (default mode) of the eager layer for these shapes, compiled now; None (and why) where
    it fails, which is reported, not fatal."""
    import torch

    torch._dynamo.reset()
    function = torch.compile(eager_layer(case), dynamic=False)
    try:
        function(*args)
    except Exception as exc:  # (an Inductor failure on one problem: the row says so)
        return None, f"{type(exc).__name__}: {exc}"[:300]
    return function, ""


def timings(calls: dict, again: dict | None = None) -> dict:
    """Sustained means and single-call medians, in us, of zero-argument calls (module docstring); `again`, calls
    timed one at a time only (eager under a second name: the latency's noise floor, unseen_epilogues_table)."""
    import torch

    from autogemm.measure import timing

    for call in calls.values():  # warm-up, as a loop would (plans settle within their first calls)
        for _ in range(8):
            call()
    torch.cuda.synchronize()
    rounds = timing.sustained_times({name: (lambda i, call=call: call()) for name, call in calls.items()})
    latency = timing.latencies({**calls, **(again or {})}, rounds=LATENCY_ROUNDS)
    return {"sustained_us": {name: statistics.fmean(t) * 1e3 for name, t in rounds.items()},
            "sustained_rounds_us": {name: [round(x * 1e3, 3) for x in t] for name, t in rounds.items()},
            "latency_us": {name: statistics.median(t) * 1e3 for name, t in latency.items()},
            "latency_rounds": LATENCY_ROUNDS, **paired_latency(latency)}


def paired_latency(latency: dict[str, list[float]]) -> dict:
    """The single calls' ratios paired by round (`timing.latencies` times every competitor once a round, the calls
    adjacent in time): each competitor's median over the rounds of its call's time over autogemm's in the same round
    (against cuBLASLt, autogemm with its GELU form: unseen_epilogues_table.ours_against), and eager's over
    eager again's. Kept beside the ratio of the medians the table judges, to see whether pairing narrows how far
    eager moves against itself: where single calls fall in two modes (host time of one call or another), each
    side's median may land in either, and their ratio jumps by the gap, where a median of paired ratios stays at
    1 while most rounds find both calls alike."""
    def median_ratio(name: str, ours: str) -> float:
        return statistics.median(t / o for t, o in zip(latency[name], latency[ours]))

    paired = {"latency_paired": {name: median_ratio(name, ours_against(name, latency)) for name in latency
                                 if name not in (AUTOGEMM, AUTOGEMM_TANH, EAGER_AGAIN)}}
    if EAGER_AGAIN in latency and EAGER in latency:
        paired["latency_paired_floor"] = median_ratio(EAGER, EAGER_AGAIN)
    return paired


def measure(spec, index: int) -> dict:
    """One problem: untuned, tuned, each timed (module docstring)."""
    import torch

    import autogemm
    from autogemm.tuning.tuner import TuneError

    dtype, case, m, n, k = spec
    what = label(spec)
    os.environ["AUTOGEMM_CACHE_DIR"] = tempfile.mkdtemp(prefix="autogemm-unseen-epilogues-")
    autogemm.reset()
    args = _tensors(spec, seed=2 * index + 1)
    expected = reference(case, *args)
    # (each layer made once: a call of the timed lambdas is the layer's call and nothing more)
    eager, ours_layer, ours_tanh = eager_layer(case), autogemm_layer(case), autogemm_layer(case, "gelu_tanh")
    calls = {EAGER: _checked(EAGER, lambda: eager(*args), expected, dtype, what),
             GEMM_ALONE: lambda: torch.nn.functional.linear(args[0], args[1])}
    row = {"index": index, "spec": list(spec), "problem": _problem(spec).key, "label": what,
           "source_digest": source_digest(), "kernels_kept": "AUTOGEMM_CUBIN_DIR" in os.environ}
    function, row["compile_error"] = compiled_layer(case, args)
    if function is not None:
        calls[COMPILED] = _checked(COMPILED, lambda: function(*args), expected, dtype, what)
    lt_handle = None
    try:
        lt_call, lt_handle, transposed = CublasLtLayer.make(case, *args)
    except Exception as exc:  # (nvmath missing or refusing: reported in the row, the run goes on)
        lt_call, transposed, row["cublaslt_error"] = None, False, f"{type(exc).__name__}: {exc}"[:300]
    if lt_call is not None:
        gelu = "gelu_tanh" if case == "bias+gelu" else "gelu"  # (cuBLASLt's GELU is the tanh form)
        lt_expected = reference(case, *args, gelu=gelu) if gelu == "gelu_tanh" else expected
        _checked(CUBLASLT, lambda: lt_call().T if transposed else lt_call(), lt_expected, dtype, what)
        calls[CUBLASLT] = lt_call  # (timed without the transposed view the check takes)
    for phase in ("untuned", "tuned"):
        if phase == "tuned":
            started = time.perf_counter()
            try:
                result = autogemm.tune(_problem(spec))
                row["tune"] = {"kept_cublas": result.kept_cublas, "config": result.config.name, "ratio": result.ratio,
                               **tune_figures(result)}
            except TuneError as exc:  # (nothing measurable for this problem: what serves is timed again all the same)
                row["tune"] = {"kept_cublas": True, "config": None, "ratio": None, "error": str(exc)[:300]}
            row["tune"]["s"] = time.perf_counter() - started
            autogemm.reset()
        ours = {AUTOGEMM: _checked(AUTOGEMM, lambda: ours_layer(*args), expected, dtype, what)}
        if CUBLASLT in calls and case == "bias+gelu":
            ours[AUTOGEMM_TANH] = _checked(AUTOGEMM_TANH, lambda: ours_tanh(*args),
                                           lt_expected, dtype, what)
        again = eager_layer(case)  # (a second function of the same form as eager's, not a wrapper of it)
        row[phase] = {**timings({**ours, **calls}, {EAGER_AGAIN: lambda: again(*args)}), "served": served(case, *args)}
    if lt_handle is not None:
        lt_handle.free()
    return row


def tune_figures(result) -> dict:
    """The tune's own comparison, as its result and its record hold it, to set beside what the draw then times:
    the best kernel's and the fastest baseline's GPU time in us (sustained where `sustained` holds the rounds'
    clock and power, else the short re-timings'), the noise its keep rule allowed, and each baseline route's time
    (the record's; absent where the tune could not cache it)."""
    from autogemm.results.cache import TuningCache

    figures = {"kernel_us": result.time_ms * 1e3, "baseline_us": result.cublas_ms * 1e3, "noise": result.noise,
               "sustained": dict(result.sustained)}
    found = TuningCache(shipped=False).lookup(result.problem, result.device.slug)  # (the row's own user cache)
    if found is not None:
        figures["baselines_us"] = {route: ms * 1e3 for route, ms in found[0].baselines.items()}
    return figures


def measure_and_release(spec, index: int) -> dict:
    """`measure`, then what the problem's tensors held given back (sizes vary a lot)."""
    row = measure(spec, index)
    release_memory()
    return row


def served(case: str, x, w, bias, residual) -> str:
    """What serves autogemm's GEMM (explain's source), how its epilogue runs (and where F.linear's route adds the
    bias, where that is the pass: its GEMM then runs without F.linear's prepared call), and whether linear's C++ memo
    made the timed calls (it holds the layer's key: serving/native_linear.py) or the Python route did."""
    import autogemm
    from autogemm.serving import dispatch

    keywords = {"residual": dict(residual=residual)}.get(case) or dict(
        bias=bias, activation={"bias": None, "bias+gelu": "gelu", "bias+silu": "silu"}[case])
    said = autogemm.explain(x, w.T, **keywords)
    route = said.get("epilogue", {}).get("route", "pass")
    bias_at = said.get("epilogue", {}).get("bias")
    if bias_at == "pass" and route != "pass":  # (F.linear's route: its bias prepared inside the call, or not)
        route += ", the bias in the pass"
    memo = dispatch._DISPATCHER.native_memo
    by_memo = memo is not None and memo.linear(x, w, keywords.get("bias"), keywords.get("activation"),
                                               keywords.get("residual")) is not None  # (the timed call's operands)
    return f"{said['source']}{': ' + said['config'] if said.get('config') else ''}" + \
        (" + epilogue pass" if route == "pass" else f" with {route}") + (" (C++ memo)" if by_memo else " (Python)")


def measurement_order(specs: list[tuple], judged_first: bool = False) -> list[tuple[int, tuple]]:
    """(index, spec) of each layer of the draw in the order they are measured: the draw's, or with `judged_first`
    the layers whose capture the table judges (M >= CAPTURE_FROM_M) first, each group in the draw's order. The
    rows keep their index, and the table orders them itself: the order changes when a layer is timed, not what."""
    items = list(enumerate(specs))
    if not judged_first:
        return items
    return sorted(items, key=lambda item: item[1][2] < CAPTURE_FROM_M)  # (a stable sort: the draw's order within)


def _out_path(args, device_slug: str) -> Path:
    if args.out:
        return Path(args.out)
    suffix = "" if args.seed == SEED and args.count == COUNT else f"-seed{args.seed}-{args.count}"
    return results_path(f"unseen-epilogues-{device_slug}{suffix}").with_suffix(".jsonl")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    results_arguments(parser, SEED, COUNT, "allow about a minute a problem: its tune, four timings and a compile")
    parser.add_argument("--judged-first", action="store_true",
                        help=f"measure the layers of {CAPTURE_FROM_M} rows or more, whose share captured the table "
                             "judges, before the others")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count must be at least 1, got {args.count}")
    specs = epilogue_problems(args.seed, args.count)
    if args.list:
        for index, spec in enumerate(specs):
            print(f"#{index:<4d}{label(spec):<40} {_problem(spec).key}")
        return 0
    lacking = draw_shortfalls(specs)
    if lacking and not (args.report or args.out) and (args.seed, args.count) == (SEED, COUNT):
        parser.error(f"seed {args.seed} cannot be the published draw: " + "; ".join(lacking)
                     + " (set SEED to another unseen seed, or pass --seed for a development draw)")
    slug, name = device_of(args.device_slug if args.report else None)
    path = _out_path(args, slug)
    require_rows_of_draw(path, specs)
    if args.report:
        return write_report(path, lambda rows: report(rows, name, args.seed, len(specs)))
    keep_compiled_kernels("autogemm-unseen-epilogues-cubins-")
    built, memo = build_linear_memo()
    if not built:
        print(f"linear's C++ memo: {memo}", flush=True)
    run_rows(path, measurement_order(specs, args.judged_first), lambda spec: _problem(spec).key, measure_and_release,
             deadline_after(args.deadline_s), lambda row: (
        f"#{row['index']:<4d}{row['label']:<40} untuned {cell(ratio(row['untuned']['sustained_us'], EAGER))}x eager  "
        f"tuned {cell(ratio(row['tuned']['sustained_us'], EAGER))}x eager, "
        f"{cell(ratio(row['tuned']['sustained_us'], COMPILED))}x compile  tune {row['tune']['s']:.0f} s "
        f"{'cuBLAS kept' if row['tune']['kept_cublas'] else 'kernel'}"
        + (f", served in {served:.3f}x its tuned time" if (served := served_over_tuned(row)) is not None else "")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
