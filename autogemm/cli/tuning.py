"""`autogemm tune` and `autogemm bench`: search the best kernel of a problem on this GPU, and re-time
a cached one against cuBLAS in the same run. The tune's flags are TuneOptions' fields, with its
defaults (tuning/options.py)."""

from __future__ import annotations

import argparse
from typing import Any

from .. import dtypes
from ..families.waves import fill
from ..gpu import launch
from ..gpu.runtime import require_gpu as gpu_or_error
from ..kernels.space import SearchSpace, SpaceError, candidate_space_names
from ..measure.evaluate import FatalEvaluationError, GpuEvaluator
from ..measure.grouped_measuring import LOOP, TORCH_GROUPED
from ..measure.scaled_measuring import baseline_name
from ..measure.timing import SUSTAINED_ROUND_MS, sustained_warmup_ms
from ..problem import Problem
from ..results.cache import TuningCache
from ..tuning.options import CONVERGED_GAIN, SAMPLERS, TuneOptions, default_jobs
from ..tuning.result import TuneError
from .arguments import CliError, CliFailure, add_problem_arguments, load_space, non_negative_int, positive_int, \
    problem_from_args
from .output import print_json

DEFAULTS = TuneOptions()


def _baseline(problem) -> tuple[str, str]:
    """(name, how it was measured) of what a tune's ratio is to: cuBLAS as matmul serves it, or for an FP8
    product what scaled_matmul serves it untuned, or for a grouped product the faster of torch's grouped mm and
    the loop."""
    if problem.grouped:
        return "torch", (f"the faster of {TORCH_GROUPED} and a {LOOP} over the groups on the same inputs, "
                         f"{problem.routing} routing, same run")
    if problem.epilogue.scale:
        name = baseline_name(problem)
        return name, f"{name} on the same FP8 bits and scales, as scaled_matmul serves the problem untuned, same run"
    if problem.epilogue.is_identity:
        return "cuBLAS", "the faster of cuBLASLt as served and cupy.matmul, same run"
    return "cuBLAS", "the faster of cuBLASLt then the epilogue's pass and cuBLASLt's own epilogue where it has it, same run"


def _sustained_row(figures: dict[str, Any]) -> str:
    """How the sustained comparison ran: its rounds, the SM clock and power seen, the short re-timings' ratio."""
    seen = (f", SM clock {figures['sm_clock_mhz']:.0f} MHz, {figures['power_w']:.0f} W"
            if figures.get("sm_clock_mhz") else ", no clock readings (NVML)")
    rounds = figures.get("rounds", 0)
    return (f"{rounds:.0f} rounds, {rounds * SUSTAINED_ROUND_MS / 1e3:.1f} s per competitor{seen}; "
            f"{figures.get('burst_ratio', 0):.3f}x in the short re-timings before them")


def _format_result(result) -> str:
    config = result.config
    baseline, measured = _baseline(result.problem)
    knobs = " ".join(f"{k}={v}" for k, v in config.to_dict().items() if k != "family")
    failures = ", ".join(f"{n} {k}" for k, n in sorted(result.failures.items())) or "none"
    regime = "sustained: back to back in rounds" if result.sustained else "steady state"
    rows = [
        ("problem", str(result.problem)),
        ("device", f"{result.device.name} ({result.device.arch}, {result.device.sm_count} SMs)"),
        ("serves", f"{baseline} (kept: {result.kept_reason}; noise {result.noise:.1%})"
         if result.kept_cublas else f"the generated kernel ({result.ratio:.3f}x {baseline}, noise {result.noise:.1%})"),
        ("best config", config.name),
        ("knobs", knobs),
        ("waves", fill(config, result.problem, result.device).describe() + f" on {result.device.sm_count} SMs"),
        ("TFLOP/s", f"{result.tflops:.2f}  (GPU time {result.time_ms * 1e3:.1f} us, {regime})"),
        (f"{baseline} TFLOP/s", f"{result.cublas_tflops:.2f}  (GPU time {result.cublas_ms * 1e3:.1f} us: {measured})"),
        *([("sustained", _sustained_row(result.sustained))] if result.sustained else []),
        ("ratio", f"{result.ratio:.3f}x {baseline} in {'sustained ' if result.sustained else ''}GPU time" + (
            f", {result.single_call_ratio:.3f}x one call at a time ({result.latency.kernel_us:.1f} us against "
            f"{result.latency.baseline_us:.1f} us)" if result.latency is not None else "")),
        ("rel. error", f"{result.rel_error:.2e}" if result.rel_error == result.rel_error else "n/a"),
        *([("spaces searched", "; ".join(f"{family} {ratio:.3f}x ({valid} trials)" for _, family, ratio, valid, _
                                          in result.searched))] if result.searched else []),
        *([("spaces not measured", "; ".join(result.unsearched))] if result.unsearched else []),
        ("trials", f"{result.valid} valid, {result.rejected} rejected, {result.failed} failed ({failures}), "
                   f"{result.duplicates} repeats; {result.study_trials} measured in the study"),
        ("wall time", f"{result.wall_s:.1f} s" + (f"  ({result.restarts} measuring-process restarts, "
                                                  f"{result.restart_s:.1f} s)" if result.restarts else "")),
        *([("stopped", f"{result.stopped}: best verified result so far kept, not re-timed")] if result.interrupted
          else [("stopped", result.stopped)] if result.stopped else []),
        ("cached in", result.cache_path or (f"not cached: {result.cache_error}" if result.cache_error else "-")),
        *([("kernels not stored", f"{result.unstored_kernels} (measured from memory; {result.storage_error})")]
          if result.unstored_kernels else []),
        ("study", f"{result.study_name} @ {result.storage or 'memory'}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def cmd_tune(args: argparse.Namespace) -> int:
    from ..tuning.tuner import tune  # (lazy: Optuna)

    problem = problem_from_args(args)
    try:
        sustained_warmup_ms()  # (a bad AUTOGEMM_SUSTAINED_WARMUP_MS named before the GPU is asked)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    space = None  # without --space: every candidate space of the problem (tuner.tune)
    if args.space:
        space = load_space(args.space)
        if space.config_class.compute_for(problem.dtype) != problem.compute:
            raise CliError(f"--space {args.space}: a {space.family} space cannot compute {problem.dtype}/"
                           f"{problem.compute}; its family computes {space.config_class.computes_names()}")
    else:
        for name in candidate_space_names(problem):  # a broken shipped space is named before the GPU is asked
            try:
                SearchSpace.load(name)
            except SpaceError as exc:
                raise CliError(str(exc)) from None
    require_gpu()
    try:
        result = tune(problem, tune_options_from(args, space), progress=not args.json)
    except (TuneError, FatalEvaluationError) as exc:
        raise CliFailure(str(exc)) from None
    if args.json:
        print_json(result.to_json())
    else:
        print(_format_result(result))
    return 0


def tune_options_from(args: argparse.Namespace, space: SearchSpace) -> TuneOptions:
    """The options `autogemm tune` was given (`space`: --space loaded, or None)."""
    return TuneOptions(trials=args.trials, timeout=args.timeout, patience=args.patience, seed=args.seed,
                       sampler=args.sampler, space=space, storage=args.storage, study_name=args.study_name,
                       jobs=args.jobs, isolate=not args.no_isolation, candidate_timeout=args.candidate_timeout)


def require_gpu() -> None:
    """GpuUnavailable (exit 3, the message naming the command: cli.main) where this host has no usable
    CUDA GPU, before the command does anything (also used by `cache verify`/`retime`)."""
    gpu_or_error()


def cmd_bench(args: argparse.Namespace) -> int:
    problem = problem_from_args(args)
    require_gpu()
    device = launch.current_device()
    found = TuningCache().lookup(problem, device.slug)
    if found is None:
        raise CliFailure(f"no tuned kernel for {problem} on {device.name}; "
                         f"run: autogemm tune {_problem_flags(problem)}")
    record, source = found
    if record.is_cublas:
        lost = f" (best generated kernel {record.best_generated['ratio']:.3f}x)" if record.best_generated else ""
        print(f"{problem} on {device.name}: the {source} cache keeps cuBLAS{lost}; matmul serves cupy.matmul. "
              f"Run `autogemm tune {_problem_flags(problem)}` to search again.")
        return 0
    evaluator = GpuEvaluator(problem, device, jobs=min(2, default_jobs()), seed=args.seed)
    try:
        (measured,), cublas_ms = evaluator.retime([record.config_object], rounds=args.rounds)
    finally:
        evaluator.close()
    if not measured.ok:
        raise CliFailure(f"cached kernel {record.config_name} failed: {measured.kind}: {measured.message}")
    ratio = cublas_ms / measured.time_ms
    out = {
        "problem": problem.key, "device": device.name, "config": record.config_name, "source": source,
        "time_ms": measured.time_ms, "tflops": measured.tflops, "cublas_ms": cublas_ms,
        "cublas_tflops": problem.flops / cublas_ms / 1e9, "ratio": ratio, "rel_error": measured.rel_error,
        "tuned_ratio": record.ratio,
    }
    if args.json:
        print_json(out)
    else:
        print(f"{problem} on {device.name}: {record.config_name} ({source} cache)\n"
              f"  {measured.tflops:.2f} TFLOP/s vs cuBLAS {out['cublas_tflops']:.2f} TFLOP/s: {ratio:.3f}x "
              f"(tuned at {record.ratio:.3f}x); rel. error {measured.rel_error:.1e}")
    return 0


def _problem_flags(problem: Problem) -> str:
    """The `autogemm tune` flags of `problem` (problem_from_args reads them back to the same problem)."""
    flags = f"--m {problem.m} --n {problem.n} --k {problem.k}"
    if problem.dtype != "float32":
        flags += f" --dtype {problem.dtype}"
    if problem.compute != dtypes.lookup(problem.dtype).compute:  # (not the dtype's default mode)
        flags += f" --compute {problem.compute}"
    if problem.batch > 1:
        flags += f" --batch {problem.batch}"
    if problem.layout != "nn":
        flags += f" --layout {problem.layout}"
    epilogue = problem.epilogue
    flags += " --bias" if epilogue.bias else ""
    flags += f" --activation {epilogue.activation}" if epilogue.activation else ""
    flags += " --residual" if epilogue.residual else ""
    if epilogue.scale:  # (an FP8 product: its scales and D's dtype)
        flags += f" --scale {epilogue.scale} --out-dtype {epilogue.out_dtype}"
    return flags


def add_tune_parser(sub: Any) -> None:
    tune_p = sub.add_parser(
        "tune", help="search the best kernel for a problem on this GPU and cache it",
        description="Search kernel configurations for one GEMM problem on the current GPU with Optuna. "
        "Every candidate is verified against a float64 reference before it is timed; cuBLAS "
        "(cupy.matmul) is timed on the same inputs in the same run. The best few are re-timed "
        "together at the end, and the winner is cached for autogemm.matmul. The study is kept, so "
        "running the same command again resumes and adds --trials more. The search starts from what is "
        "known (the config serving the problem now, the nearest tuned problems' winners, the model's "
        "predictions) and stops at --trials, --timeout or convergence (--patience), whichever comes "
        "first. If no kernel beats cuBLAS by more than the measured noise, cuBLAS is kept. Ctrl-C stops "
        "and keeps the best verified result so far.")
    add_problem_arguments(tune_p, m_required=True, timed=True)
    search = tune_p.add_argument_group("search")
    search.add_argument("--trials", type=positive_int, default=DEFAULTS.trials,
                        help=f"measured (valid) candidates to try in this run (default {DEFAULTS.trials})")
    search.add_argument("--timeout", type=float, default=DEFAULTS.timeout,
                        help=f"seconds of search before the final re-timing; the seeds compiling then are still "
                             f"measured (default {DEFAULTS.timeout:g})")
    search.add_argument("--patience", type=non_negative_int, default=DEFAULTS.patience, metavar="TRIALS",
                        help=f"stop once this many measured trials in a row gain less than {100 * CONVERGED_GAIN:g}%% "
                             f"on the best (default {DEFAULTS.patience}; 0: never stop early)")
    search.add_argument("--seed", type=int, default=DEFAULTS.seed, help=f"sampler seed (default {DEFAULTS.seed})")
    search.add_argument("--sampler", choices=SAMPLERS, default=DEFAULTS.sampler,
                        help=f"Optuna sampler (default {DEFAULTS.sampler})")
    search.add_argument("--space", help="search-space TOML file or shipped name (default: the one for the dtype and "
                                        "compute mode, for M or N <= 16 also the GEMV space; on sm_90 the Hopper TMA "
                                        "space instead of it for float16 and bfloat16 and beside it for TF32: each "
                                        "searched with a share of the budget, the best kept)")
    search.add_argument("--storage", help="Optuna storage URL (default: SQLite in the cache directory; "
                                          "':memory:' keeps nothing)")
    search.add_argument("--study-name", help="study name (default: device, problem, space and template version; where "
                                             "several spaces are searched, the space's name is appended)")
    search.add_argument("--jobs", type=positive_int, default=default_jobs(),
                        help=f"parallel compile workers (default {default_jobs()}: this machine's cores)")
    safety = tune_p.add_argument_group("fault isolation")
    safety.add_argument("--candidate-timeout", type=float, metavar="SECONDS",
                        help="time one candidate may take before it counts as hung and its measuring process "
                             "is killed and restarted (default: from the problem's flops and the GPU's peak, "
                             "and 60 s more for the tune's first candidate, which also pays the measuring "
                             "process's one-time work)")
    safety.add_argument("--no-isolation", action="store_true",
                        help="measure in this process: a little less overhead, but a faulting or hanging "
                             "kernel ends the tune")
    tune_p.add_argument("--json", action="store_true", help="print the result as JSON (no progress bar)")
    tune_p.set_defaults(handler=cmd_tune)


def add_bench_parser(sub: Any) -> None:
    bench_p = sub.add_parser("bench", help="re-time the cached kernel of a problem against cuBLAS",
                             description="Verify and re-time the cached kernel of a problem on this GPU, "
                             "interleaved with cuBLAS (cupy.matmul) on the same inputs, and print the ratio.")
    add_problem_arguments(bench_p, m_required=True, timed=True)
    bench_p.add_argument("--rounds", type=positive_int, default=5, help="interleaved timing rounds (default 5)")
    bench_p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    bench_p.add_argument("--json", action="store_true", help="print the result as JSON")
    bench_p.set_defaults(handler=cmd_bench)
