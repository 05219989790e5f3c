"""What each route of a product runs, and how fast, where `autogemm.matmul` trails what a user would call
instead: the CUDA kernels each launches (torch.profiler, which sees every kernel of the process: cuBLAS's
`nvjet_*` names give its tile, stages and cluster) and its sustained GPU time, all routes in the same rounds
(autogemm/measure/timing.py `sustained_times`).

The routes of one product, on the same memory:
- autogemm.matmul on the CuPy arrays, and on torch views of them, after 20 calls (as a user's loop settles
  them: the first calls choose between cuBLASLt and cublasGemmEx);
- torch.matmul and cupy.matmul (baselines.user_calls);
- the two cuBLAS calls autogemm's fallback chooses between, each alone: cuBLASLt with its heuristic's
  algorithm and cublasGemmEx as autogemm makes it (gpu/cublas_gemm.py).

A problem is `dtype:layout:MxNxK` or `dtype:layout:BATCHxMxNxK` (bench_unseen's labels with colons), dtype one
of float16, bfloat16, float32 and float64 (TF32 needs a process of its own: bench_unseen's child).

    python benchmarks/served_routes.py bfloat16:nn:2238x2243x2243 float32:nn:2x2560x32768
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

DTYPES = ("float16", "bfloat16", "float32", "float64")
LAYOUTS = ("nn", "nt", "tn", "tt")
LARGEST_SIDE = 1 << 17
LARGEST_BYTES = 8e9  # of A, B and C together
WARM_CALLS = 20
TORCH = "torch.matmul"


def parse_problem(text: str) -> tuple:
    """A bench_unseen spec (dtype, compute, layout, batch, M, N, K) from `dtype:layout:[BATCHx]MxNxK`
    (ValueError naming what does not read so, or what would not fit)."""
    parts = text.strip().split(":")
    sizes = parts[2].split("x") if len(parts) == 3 else []
    if len(parts) != 3 or parts[0] not in DTYPES or parts[1] not in LAYOUTS or len(sizes) not in (3, 4) \
            or not all(size.isdigit() and 0 < int(size) <= LARGEST_SIDE for size in sizes):
        raise ValueError(f"{text!r} is not a problem: one of {', '.join(DTYPES)}, then one of {', '.join(LAYOUTS)}, "
                         f"then MxNxK or BATCHxMxNxK (each from 1 to {LARGEST_SIDE}), e.g. bfloat16:nn:2238x2243x2243")
    batch, m, n, k = ([1] if len(sizes) == 3 else []) + [int(size) for size in sizes]
    itemsize = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}[parts[0]]
    if itemsize * batch * (m * k + k * n + m * n) > LARGEST_BYTES:
        raise ValueError(f"{text!r}: A, B and C would take more than {LARGEST_BYTES / 1e9:g} GB")
    return parts[0], {"float64": "fp64"}.get(parts[0], "fp32"), parts[1], batch, m, n, k


def routes(a, b) -> dict:
    """name -> zero-argument call of every route of a @ b (module docstring), each allocating its output."""
    import cupy

    import autogemm
    from autogemm.gpu.cublas_gemm import cublas_launcher
    from autogemm.gpu.operands import KernelOperand, describe
    from autogemm.measure import baselines
    from autogemm.problem import Problem

    calls = {"autogemm.matmul (CuPy)": lambda: autogemm.matmul(a, b), **baselines.user_calls(a, b)}
    if TORCH in calls:
        ta, tb = baselines.as_torch(a), baselines.as_torch(b)
        calls["autogemm.matmul (tensors)"] = lambda: autogemm.matmul(ta, tb)
    info_a, info_b = describe(a, "a"), describe(b, "b")
    layout_a, layout_b = info_a.layout(), info_b.layout()
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = a.shape[0] if a.ndim == 3 else 1
    shape = (batch, m, n) if batch > 1 else (m, n)
    problem = Problem(m, n, k, batch=batch, dtype=info_a.dtype, trans_a=layout_a.transposed,
                      trans_b=layout_b.transposed)
    layout_c = KernelOperand(False, n, m * n if batch > 1 else 0, 0)
    for name, api in (("cuBLASLt (heuristic)", "lt"), ("cublasGemmEx (autogemm's call)", "gemmex")):
        launch = cublas_launcher(problem, layout_a, layout_b, layout_c, api=api)

        def call(launch=launch):
            c = cupy.empty(shape, dtype=a.dtype)
            launch(layout_a.pointer, layout_b.pointer, c.data.ptr, 1.0, 0.0)
            return c

        calls[name] = call
    return calls


def kernels(call) -> list[tuple[str, float]]:
    """(name, GPU us) of each CUDA kernel one call launches, as torch.profiler sees them."""
    import torch

    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        call()
        torch.cuda.synchronize()
    return [(event.name, event.device_time) for event in profile.events() if event.device_time > 0]


def examine(spec) -> list[str]:
    """One problem's lines: what serves it, each route's kernels and sustained time against torch.matmul's."""
    import autogemm
    from autogemm.measure import timing
    from bench_common import make_operands, problem_label

    problem, a, b = make_operands(spec)
    calls = routes(a, b)
    for _ in range(WARM_CALLS):
        for call in calls.values():
            call()
    served = autogemm.explain(a, b)
    launched = {name: kernels(call) for name, call in calls.items()}
    rounds = timing.sustained_times({name: (lambda i, call=call: call()) for name, call in calls.items()})
    means = {name: statistics.fmean(times) * 1e3 for name, times in rounds.items()}
    lines = [f"## {problem_label(problem)}", "", f"served: {served['source']} ({served['reason']})", "",
             "| route | sustained us | torch.matmul / route | kernels (GPU us of one call) |",
             "| --- | ---: | ---: | --- |"]
    for name in calls:
        names = "; ".join(f"{kernel} ({us:.1f})" for kernel, us in launched[name]) or "-"
        ratio = f"{means[TORCH] / means[name]:.3f}" if TORCH in means else "-"
        lines.append(f"| {name} | {means[name]:.1f} | {ratio} | {names} |")
    return lines + [""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="+", help="dtype:layout:MxNxK or dtype:layout:BATCHxMxNxK")
    args = parser.parse_args(argv)
    try:
        specs = [parse_problem(text) for text in args.problems]
    except ValueError as exc:
        parser.error(str(exc))
    for spec in specs:
        print("\n".join(examine(spec)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
