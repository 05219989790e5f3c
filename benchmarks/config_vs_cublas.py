"""Named configurations of a generated kernel against cuBLAS on one product, sustained, with what each runs:
where a kernel whose tiles fill the SMs still trails cuBLAS (issue 62: 1-1.5% at the power limit on BF16
products of 97-100% full waves), to see the cost per tile beside cuBLAS's own choice before any template work.

For each problem (bench_unseen's labels with colons, as served_routes.py reads them) and each configuration:
the kernel bound to the operands as stored (gpu/launch.py `bind`), its result checked against cuBLAS's, and
its tiles and waves on this GPU (families/waves.py); then every kernel, torch.matmul and cupy.matmul in the
same sustained rounds (autogemm/measure/timing.py `sustained_times`), the SM clock and power seen meanwhile
(NVML), and the kernels cuBLAS launches for torch.matmul (torch.profiler: the `nvjet_*` names give its tile,
stages and cluster, in column-major terms).

    python benchmarks/config_vs_cublas.py bfloat16:nt:6144x18944x3584 \\
        hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts hopper_128x192x64_w64x192_s4_g8_k1_o1_p_c2

With --between MB every call of every competitor is followed by a memory-bound elementwise kernel over MB
megabytes (as a model's activation or norm follows its GEMM), also timed alone: a kernel whose launch overlaps
the one before it (`dependent_launch`) then overlaps another kernel, not the previous call of itself.

With --epilogue CASE (bias, bias+gelu, bias+silu, residual: bench_unseen_epilogues' cases) the product is a
layer as `torch.nn.Linear` holds it (layout nt: x M x K, w N x K) and each configuration fuses the epilogue in
its store; the baselines are then eager PyTorch (`F.linear(x, w, bias)` and the activation, or
`F.linear(x, w) + residual`) and the GEMM alone (`F.linear(x, w)`), each configuration checked against float64,
and each row says its share of eager's epilogue cost captured, (eager - route) / (eager - GEMM alone), as
bench_unseen_epilogues judges a tuned layer (issue 63):

    python benchmarks/config_vs_cublas.py bfloat16:nt:1024x9216x2304 --epilogue bias+silu \
        hopper_256x128x64_w128x128_s4_g8_k1_o1_p_ts_pp_fa_hd

With --lt-algorithms N the competitors include cuBLASLt's heuristic's first N algorithms for the product
with the layer's epilogue inside the GEMM (none; BIAS for a bias; a residual read as C), each checked as a
configuration is and named by the kernel it launches: whether an algorithm the heuristic ranks lower runs a
layer faster than its first choice, the one eager's F.linear runs (configurations may then be left out).
With an epilogue, the algorithm the heuristic picks for the GEMM alone competes too, where cuBLASLt's
check says it computes the epilogue:

    python benchmarks/config_vs_cublas.py bfloat16:nt:1024x9216x3072 --epilogue bias --lt-algorithms 8

With --profile-once each is launched once for Nsight Compute instead of timed, e.g. to read every kernel's
stall samples line by line in its SASS beside cuBLAS's:

    ncu --profile-from-start off --set full --import-source no -o report \\
        python benchmarks/config_vs_cublas.py bfloat16:nt:4096x13824x5120 CONFIG... --profile-once
    ncu -i report.ncu-rep --page source --csv --print-source sass
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from served_routes import TORCH, kernels, parse_problem  # noqa: E402

ROUNDS = 20
WARM_CALLS = 3  # (--profile-once: launches of each before the profiled one)
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-2, "float64": 1e-12}  # against cuBLAS's result


def configs_from(names: list[str]) -> list:
    """The configurations of `names` (ValueError naming one that is no configuration)."""
    from autogemm.families import config_from_name

    configs = []
    for name in names:
        try:
            configs.append(config_from_name(name))
        except (ValueError, KeyError) as exc:
            raise ValueError(f"{name!r} is not a configuration name ({exc})") from None
    return configs


def launched_once(calls: dict) -> list[str]:
    """Each call warmed up, then launched once inside cudaProfilerStart/Stop, in order (for
    `ncu --profile-from-start off`); the lines say what was launched."""
    import cupy

    for _ in range(WARM_CALLS):
        for call in calls.values():
            call(0)
    cupy.cuda.Device().synchronize()
    cupy.cuda.profiler.start()
    try:
        for call in calls.values():
            call(0)
            cupy.cuda.Device().synchronize()
    finally:
        cupy.cuda.profiler.stop()
    return [f"launched once each, in this order, between cudaProfilerStart and Stop: {', '.join(calls)}", ""]


BETWEEN_ALONE = "(the kernel between, alone)"


def with_kernel_between(calls: dict, between) -> dict:
    """Each call followed by `between()` (enqueued right after it, on the same stream), and `between` alone as a
    competitor of its own (BETWEEN_ALONE), so that its share of each competitor's time can be taken out."""
    wrapped = {name: (lambda i, call=call: (call(i), between())) for name, call in calls.items()}
    wrapped[BETWEEN_ALONE] = lambda i: between()
    return wrapped


def elementwise_between(megabytes: float):
    """A memory-bound elementwise kernel over `megabytes` of float16 (CuPy's multiply into a buffer kept)."""
    import cupy

    x = cupy.ones(max(1, int(megabytes * 2**20) // 2), dtype=cupy.float16)
    y = cupy.empty_like(x)
    return lambda: cupy.multiply(x, 1.0001, out=y)


EPILOGUE_CASES = ("bias", "bias+gelu", "bias+silu", "residual")
EAGER, GEMM_ALONE = "eager F.linear + epilogue", "F.linear(x, w) alone"


def layer_calls(case: str, dtype: str, a, b, seed: int = 2) -> tuple[dict, object, object, object]:
    """--epilogue: (the baselines, the float64 reference, bias, residual) of the layer y = epilogue(a @ b), a of
    M x K and b the transposed view of w, N x K (make_operands' layout nt, of `dtype`): eager PyTorch and the GEMM
    alone on views of the same memory; bias (N values) and residual (M x N) drawn in [-1, 1] in a's type, each
    None where the case adds none (bind refuses an operand its epilogue does not add)."""
    import cupy
    import torch.nn.functional as F

    from autogemm.measure.baselines import as_torch
    from autogemm.measure.bench import random_uniform
    from bench_common import case_epilogue
    from bench_unseen_epilogues import eager_layer, reference

    def drawn(shape, offset):  # random_uniform's bits, as the ml_dtypes type make_operands gave a (BF16)
        values = random_uniform(shape, dtype, seed=seed + offset)
        return values.view(a.dtype) if dtype == "bfloat16" else values

    m, n = a.shape[0], b.shape[1]
    epilogue = case_epilogue(case)
    bias = drawn((n,), 0) if epilogue.bias else None
    residual = drawn((m, n), 1) if epilogue.residual else None
    x, w = as_torch(a), as_torch(b).T
    t_bias, t_residual = (as_torch(v) if v is not None else None for v in (bias, residual))
    eager = eager_layer(case)
    calls = {EAGER: lambda i: eager(x, w, t_bias, t_residual), GEMM_ALONE: lambda i: F.linear(x, w)}
    return calls, cupy.asarray(reference(case, x, w, t_bias, t_residual)), bias, residual


LT_CASES = ("", "bias", "residual")  # the cases whose whole epilogue cuBLASLt computes inside its GEMM


def lt_algorithm_calls(problem, stored_a, stored_b, bias, residual, count: int) -> list[tuple]:
    """--lt-algorithms: (label, call, output, description) of each of cuBLASLt's heuristic's first `count`
    algorithms (fewer where it offers fewer) for `problem` with its epilogue inside the GEMM (the bias, or the
    residual read as C: cublas_epilogue.lt_epilogue; DEFAULT without one; `bias` and `residual` as layer_calls
    gives them, None where the epilogue adds none), each writing an output of its own;
    the description gives the heuristic's waves and workspace. With an epilogue, last, the GEMM alone's
    algorithm computing it, where cuBLASLt's check takes it (its description says if the heuristic ranked it)."""
    import cupy

    from autogemm.epilogue import Epilogue
    from autogemm.gpu.cublas_epilogue import LT_BARE, cublas_epilogue_launcher, lt_epilogue
    from autogemm.gpu.cublas_gemm import alignment_of
    from autogemm.gpu.operands import describe
    from autogemm.measure.epilogue_routes import storage_layouts

    if count <= 0:  # (none asked: nothing to look up, whichever the epilogue)
        return []
    epilogue = problem.epilogue
    name = "DEFAULT" if epilogue.is_identity else lt_epilogue(epilogue, problem.dtype)
    if name is None:
        raise ValueError(f"cuBLASLt has no epilogue computing {epilogue} on {problem.dtype} products")
    bare = dataclasses.replace(problem, epilogue=Epilogue())
    ordinal = cupy.cuda.Device().id

    def launched(**which):
        d = cupy.empty(((problem.batch,) if problem.batch > 1 else ()) + (problem.m, problem.n), dtype=stored_a.dtype)
        layout_a, layout_b, layout_d = storage_layouts(bare, stored_a, stored_b, d)
        layout_r = describe(residual, "residual", bfloat16_bits=True).storage(False) if residual is not None else None
        pbias, presidual = (0 if x is None else x.data.ptr for x in (bias, residual))
        pointers = [layout_a.pointer, layout_b.pointer, layout_d.pointer] + [x for x in (pbias, presidual) if x]
        launch = cublas_epilogue_launcher(bare, layout_a, layout_b, layout_d, name, layout_r, pbias,
                                          min(alignment_of(x) for x in pointers), ordinal, **which)
        if launch is None:
            return None
        call = (lambda i, launch=launch, pa=layout_a.pointer, pb=layout_b.pointer, pd=layout_d.pointer,
                pbias=pbias, presidual=presidual: launch(pa, pb, pd, 1.0, cupy.cuda.get_current_stream().ptr, pbias,
                                                         presidual))
        return launch.algorithm[0], call, d

    def described(result) -> str:
        return (f"{float(result['waves_count']):.2f} waves, "
                f"{int(result['workspace_size']) / 2**20:.1f} MiB workspace")

    found, algorithms = [], []
    for rank in range(count):
        got = launched(rank=rank)
        if got is None:
            break
        result, call, d = got
        algorithms.append(result["algo"].tobytes())
        found.append((f"cuBLASLt {name} #{rank + 1}", call, d, f"heuristic: {described(result)}"))
    # the GEMM alone's algorithm with the epilogue, where cuBLASLt's check takes it: the heuristic picks apart
    # for each epilogue, and a kernel it picks for a bias has run 2-5.5% slower than the bare product's
    got = launched(rank=LT_BARE) if name != "DEFAULT" or residual is not None else None
    if got is not None:
        result, call, d = got
        rank = algorithms.index(result["algo"].tobytes()) + 1 if result["algo"].tobytes() in algorithms else 0
        found.append((f"cuBLASLt {name}, the GEMM alone's algorithm", call, d,
                      f"checked: {described(result)}" + (f"; the heuristic's #{rank} too" if rank else "")))
    return found


def captured(means: dict, name: str) -> str:
    """--epilogue: the share of eager's epilogue cost (eager over the GEMM alone) route `name` captures, by
    unseen_epilogues_table.ceiling, as bench_unseen_epilogues judges it; "-" where eager is no slower than the
    GEMM alone (or either was not timed)."""
    import unseen_epilogues_table as table

    if EAGER not in means or GEMM_ALONE not in means:
        return "-"
    share = table.ceiling({table.EAGER: means[EAGER], table.GEMM_ALONE: means[GEMM_ALONE],
                           table.AUTOGEMM: means[name]})[1]
    return "-" if share is None else f"{share:.0%}"


def examine(spec, configs: list, rounds: int, profile_once: bool = False, between_mb: float = 0.0,
            case: str = "", lt_algorithms: int = 0) -> list[str]:
    """One problem's lines: each configuration's and each baseline's sustained time, the fill of each kernel's
    tiles, the clocks, and cuBLAS's kernels (with `profile_once`, each launched once for a profiler instead).
    With an epilogue `case`, the configurations fuse it and the baselines are the layer's (layer_calls).
    With `lt_algorithms`, cuBLASLt's heuristic's first that many algorithms compete too (lt_algorithm_calls)."""
    import cupy
    import numpy as np

    from autogemm.families import waves
    from autogemm.gpu.launch import bind, current_device
    from autogemm.measure import baselines, timing
    from autogemm.measure.bench import relative_error, to_float64
    from autogemm.measure.clocks import ClockMonitor
    from bench_common import case_epilogue, make_operands, problem_label

    problem, a, b = make_operands(spec)
    device = current_device()
    stored_a = cupy.swapaxes(a, -1, -2) if problem.trans_a else a  # (make_operands' transposed operands are views)
    stored_b = cupy.swapaxes(b, -1, -2) if problem.trans_b else b

    def bits(x):  # (bfloat16 as its bits, which to_float64 reads)
        return x.view(np.uint16) if problem.dtype == "bfloat16" else x

    fused = {}
    if case:
        calls, reference, bias, residual = layer_calls(case, problem.dtype, a, b)
        problem = dataclasses.replace(problem, epilogue=case_epilogue(case))
        fused = dict(epilogue=problem.epilogue, bias=bias, residual=residual)
        base = EAGER
    else:
        calls = {name: (lambda i, call=call: call()) for name, call in baselines.user_calls(a, b).items()}
        reference, base = to_float64(bits(cupy.matmul(a, b))), TORCH
        bias = residual = None
    lines = [f"## {problem_label(problem)}{' with ' + case if case else ''} on {device.name} "
             f"({device.sm_count} SMs)", ""]
    fills = {}
    for config in configs:
        faults = config.check(problem, device)
        if faults:
            lines.append(f"- {config.name}: cannot run this problem ({'; '.join(faults)})")
            continue
        run, c = bind(config, stored_a, stored_b, trans_a=problem.trans_a, trans_b=problem.trans_b, **fused)
        run()
        error = relative_error(bits(c), reference)
        if not error <= TOLERANCE[problem.dtype]:
            lines.append(f"- {config.name}: off by {error:.3g} against {'float64' if case else 'cuBLAS'} (limit "
                         f"{TOLERANCE[problem.dtype]:g}): not timed")
            continue
        calls[config.name] = lambda i, run=run: run()
        fills[config.name] = waves.fill(config, problem, device).describe()
    lt_names = []
    for name, call, d, description in lt_algorithm_calls(problem, stored_a, stored_b, bias, residual, lt_algorithms):
        call(0)
        error = relative_error(bits(d), reference)
        if not error <= TOLERANCE[problem.dtype]:
            lines.append(f"- {name}: off by {error:.3g} (limit {TOLERANCE[problem.dtype]:g}): not timed")
            continue
        calls[name], fills[name] = call, description
        lt_names.append(name)
    if profile_once:
        return lines + launched_once(calls)
    timed = with_kernel_between(calls, elementwise_between(between_mb)) if between_mb else calls
    with ClockMonitor() as clocks:
        times = timing.sustained_times(timed, rounds=rounds)
    figures = clocks.figures()
    means = {name: statistics.fmean(values) * 1e3 for name, values in times.items()}
    spread = {name: statistics.pstdev(values) / statistics.fmean(values) for name, values in times.items()}
    lines += ["", f"sustained, {rounds} rounds; SM clock {figures.get('sm_clock_mhz', float('nan')):.0f} MHz, "
                  f"power {figures.get('power_w', float('nan')):.0f} W (medians over the rounds)"]
    if between_mb:
        alone = means.pop(BETWEEN_ALONE)
        means = {name: us - alone for name, us in means.items()}
        lines += ["", f"each call followed by an elementwise kernel over {between_mb:g} MB, {alone:.1f} us alone: "
                      "the figures below are each call's time with it, less that"]
    share = " captured |" if case else ""
    lines += ["", f"| route | us | TFLOP/s | {base} / route |{share} spread | tiles |",
              f"| --- | ---: | ---: | ---: |{' ---: |' if case else ''} ---: | --- |"]
    for name, us in sorted(means.items(), key=lambda item: item[1]):
        ratio = f"{means[base] / us:.3f}" if base in means else "-"
        lines.append(f"| {name} | {us:.1f} | {problem.flops / us / 1e6:.0f} | {ratio} |"
                     f"{f' {captured(means, name)} |' if case else ''} {spread[name]:.2%} | {fills.get(name, '')} |")
    baselines_launched = [base, GEMM_ALONE] if case else [base]
    for name in baselines_launched + lt_names:
        if name in calls:
            launched = "; ".join(f"{kernel} ({us:.1f} us)" for kernel, us in kernels(lambda: calls[name](0)))
            lines += ["", f"{name} launches: {launched or '-'}"]
    return lines + [""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", help="dtype:layout:MxNxK or dtype:layout:BATCHxMxNxK (float16, bfloat16, "
                                        "float32, float64)")
    parser.add_argument("configs", nargs="*", help="configuration names (as `autogemm tune` prints them)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"sustained rounds (default {ROUNDS})")
    parser.add_argument("--profile-once", action="store_true",
                        help="instead of timing, launch each configuration and baseline once (after a warm-up) between "
                             "cudaProfilerStart and Stop: run under `ncu --profile-from-start off`")
    parser.add_argument("--between", type=float, default=0.0, metavar="MB",
                        help="follow every call of every competitor with an elementwise kernel over MB megabytes, also "
                             "timed alone and taken out of each figure (default 0: none)")
    parser.add_argument("--epilogue", choices=EPILOGUE_CASES, default="",
                        help="time a layer (layout nt, as torch.nn.Linear holds it) with this epilogue fused in each "
                             "configuration, against eager PyTorch and the GEMM alone, with the share captured")
    parser.add_argument("--lt-algorithms", type=int, default=0, metavar="N",
                        help="time cuBLASLt's heuristic's first N algorithms (1 to 64) for the product with the layer's "
                             "epilogue inside the GEMM (none, a bias, or a residual read as C) beside the rest, and "
                             "with an epilogue the GEMM alone's algorithm computing it where cuBLASLt's check takes it")
    args = parser.parse_intermixed_args(argv)  # options may sit between the problem and its configs
    if not args.configs and not args.lt_algorithms:
        parser.error("name a configuration to time, or --lt-algorithms N")
    if not 0 <= args.lt_algorithms <= 64:
        parser.error("--lt-algorithms must be from 0 to 64")
    if args.lt_algorithms and args.epilogue not in LT_CASES:
        parser.error(f"--lt-algorithms: cuBLASLt's epilogues compute no {args.epilogue.partition('+')[2]} as "
                     f"F.{args.epilogue.partition('+')[2]} does (only a bias, or a residual read as C)")
    if not 1 <= args.rounds <= 1000:
        parser.error("--rounds must be from 1 to 1000")
    try:
        spec = parse_problem(args.problem)
        configs = configs_from(args.configs)
    except ValueError as exc:
        parser.error(str(exc))
    if not 0 <= args.between <= 4096:
        parser.error("--between must be from 0 to 4096 (MB)")
    if args.epilogue and (spec[2] != "nt" or spec[3] != 1 or spec[0] not in ("float16", "bfloat16")):
        parser.error(f"--epilogue times a layer as torch.nn.Linear holds it: float16 or bfloat16, layout nt, no batch "
                     f"(not {args.problem})")
    print("\n".join(examine(spec, configs, args.rounds, args.profile_once, args.between, args.epilogue,
                             args.lt_algorithms)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
