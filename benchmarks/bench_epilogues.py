"""Epilogues: an LLM layer's GEMM with what follows it (bias + GELU, bias + SiLU, a residual, the SwiGLU
gate), autogemm against what a PyTorch user would run instead, by single-call latency.

Llama-3 8B and 70B shapes (hidden 4096 / 8192, intermediate 14336 / 28672): bias + GELU and bias + SiLU on
the up projection (N = intermediate, K = hidden), a residual on the down projection (N = hidden,
K = intermediate), the SwiGLU gate on the gate and up projections (2 × intermediate rows stacked), at
M (tokens) in 1, 16, 128, 1024, 4096, in FP16 and BF16. The competitors, on the same torch tensors:

- autogemm: `autogemm.linear(x, w, bias, activation=..., residual=..., gated=...)`;
- torch eager: `torch.matmul(x, w.T)` and then the elementwise ops, the way eager PyTorch runs a
  layer written so (`F.gelu(y + bias)`, `y + residual`; the SwiGLU MLP as Hugging Face's Llama writes
  it, `F.silu(x @ w_gate.T) * (x @ w_up.T)`: two GEMMs);
- cuBLASLt's own epilogue through nvmath-python (the stateful `Matmul`, planned once), where cuBLASLt
  has one: GELU_BIAS (cuBLASLt's GELU is the tanh form, checked here against both forms; autogemm is
  then timed with "gelu_tanh"), and the residual as C with beta = 1. SiLU and the gate have none;
- torch.compile of the eager layer (dynamic shapes: one compile per layer kind and dtype), where it
  compiles within --compile-budget seconds in all; reported, not judged;
- the GEMM alone, `torch.matmul(x, w.T)` with no epilogue (the gate's one GEMM over both projections):
  not a competitor but the ceiling. Eager's time over it is the best ratio any implementation can reach
  whose GEMM runs at cuBLAS's speed and whose epilogue costs nothing; autogemm's time over it is what its
  epilogue costs.

Each problem: results checked first against float64 (torch eager in float64; a wrong result ends the
run), every competitor warmed up, then timed by latency (autogemm/measure/timing.py: each call on an
idle GPU, host time included, in an order drawn afresh each round; medians), which the acceptance
judges, and by GPU time (timing.gpu_time: back-to-back calls behind a gate, no host limit on anyone).
Ratio = the competitor's time / autogemm's (> 1: autogemm is faster). An empty user cache with the
shipped results on: what a new user meets. Writes benchmarks/results/epilogues-<device>.md (and .json).

    python benchmarks/bench_epilogues.py
    python benchmarks/bench_epilogues.py --models Llama-3-8B --ms 1,128 --rounds 10   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import build_linear_memo, geomean, results_path  # noqa: E402

MODELS = {"Llama-3-8B": (4096, 14336), "Llama-3-70B": (8192, 28672)}  # (hidden, intermediate)
CASES = ("bias+gelu", "bias+silu", "residual", "swiglu")
MS = (1, 16, 128, 1024, 4096)
DTYPES = ("float16", "bfloat16")
# latency calls a competitor: cheap (one call each on an idle GPU); at 25, on layers whose route did not change,
# the ratio to eager moved by a standard deviation of 4.9% between two runs on an H200
ROUNDS = 200
GPU_TIME_MS = 30.0
COMPILE_BUDGET_S = 600.0
AUTOGEMM, EAGER, CUBLASLT, COMPILED = "autogemm", "torch eager", "cuBLASLt epilogue (nvmath)", "torch.compile"
GEMM_ALONE = "GEMM alone (torch.matmul)"  # the ceiling's denominator, not a competitor
TOLERANCE = {"float16": 5e-3, "bfloat16": 2e-2}  # relative (Frobenius) error to float64, K up to 28672


def layer_shape(case: str, hidden: int, intermediate: int) -> tuple[int, int]:
    """(N, K) of the weight the case multiplies by (N: rows of w; the gate's 2 × intermediate)."""
    if case == "residual":
        return hidden, intermediate
    if case == "swiglu":
        return 2 * intermediate, hidden
    return intermediate, hidden


def eager_layer(case: str):
    """The layer as eager PyTorch runs it: the GEMM, then one kernel per elementwise step."""
    import torch
    import torch.nn.functional as F

    if case == "bias+gelu":
        return lambda x, w, bias, residual: F.gelu(torch.matmul(x, w.T) + bias)
    if case == "bias+silu":
        return lambda x, w, bias, residual: F.silu(torch.matmul(x, w.T) + bias)
    if case == "residual":
        return lambda x, w, bias, residual: torch.matmul(x, w.T) + residual

    def swiglu(x, w, bias, residual):  # Hugging Face's LlamaMLP: act(gate_proj(x)) * up_proj(x)
        half = w.shape[0] // 2
        return F.silu(torch.matmul(x, w[:half].T)) * torch.matmul(x, w[half:].T)
    return swiglu


def autogemm_layer(case: str, gelu: str = "gelu"):
    import autogemm

    if case == "bias+gelu":
        return lambda x, w, bias, residual: autogemm.linear(x, w, bias, activation=gelu)
    if case == "bias+silu":
        return lambda x, w, bias, residual: autogemm.linear(x, w, bias, activation="silu")
    if case == "residual":
        return lambda x, w, bias, residual: autogemm.linear(x, w, residual=residual)
    return lambda x, w, bias, residual: autogemm.linear(x, w, activation="silu", gated=True)


def reference(case: str, x, w, bias, residual, gelu: str = "gelu"):
    """The layer in float64."""
    import torch.nn.functional as F

    x, w = x.double(), w.double()
    if case == "swiglu":
        half = w.shape[0] // 2
        return F.silu(x @ w[:half].T) * (x @ w[half:].T)
    y = x @ w.T
    if case == "residual":
        return y + residual.double()
    y = y + bias.double()
    if case == "bias+silu":
        return F.silu(y)
    return F.gelu(y, approximate="tanh" if gelu == "gelu_tanh" else "none")


def relative_error(result, expected) -> float:
    import torch

    result = result.double()
    return float(torch.linalg.norm(result - expected) / max(float(torch.linalg.norm(expected)), 1e-300))


class CublasLtLayer:
    """cuBLASLt with its own epilogue through nvmath-python's stateful Matmul, planned once: BIAS for a
    bias alone and GELU_BIAS for bias + GELU (its bias runs along the result's rows, so the product is
    computed transposed, yᵀ = w xᵀ, as torch's own fused linear does), the residual as C with beta = 1.
    `None` where cuBLASLt has no epilogue for the case."""

    @staticmethod
    def make(case: str, x, w, bias, residual):
        import torch
        from nvmath.linalg.advanced import Matmul, MatmulEpilog

        stream = torch.cuda.current_stream()
        if case in ("bias", "bias+gelu"):
            mm = Matmul(w, x.T, stream=stream)
            epilog = MatmulEpilog.BIAS if case == "bias" else MatmulEpilog.GELU_BIAS
            mm.plan(epilog=epilog, epilog_inputs={"bias": bias}, stream=stream)
            return (lambda: mm.execute(stream=stream)), mm, True
        if case == "residual":
            mm = Matmul(x, w.T, c=residual, beta=1.0, stream=stream)
            mm.plan(stream=stream)
            return (lambda: mm.execute(stream=stream)), mm, False
        return None, None, False


def measure(model: str, case: str, m: int, dtype: str, rounds: int, compiled: dict, compile_left: list,
            gpu_time_ms: float = 0.0) -> dict:
    import torch

    from autogemm.measure import timing

    hidden, intermediate = MODELS[model]
    n, k = layer_shape(case, hidden, intermediate)
    torch_dtype = getattr(torch, dtype)
    generator = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    x = torch.randn(m, k, device="cuda", dtype=torch_dtype, generator=generator)
    w = (torch.randn(n, k, device="cuda", dtype=torch_dtype, generator=generator) / k ** 0.5).to(torch_dtype)
    bias = torch.randn(n, device="cuda", dtype=torch_dtype, generator=generator)
    residual = torch.randn(m, hidden if case == "residual" else n, device="cuda", dtype=torch_dtype, generator=generator)
    args = (x, w, bias, residual)
    calls = {AUTOGEMM: autogemm_layer(case), EAGER: eager_layer(case)}
    expected = reference(case, *args)
    errors = {name: relative_error(layer(*args), expected) for name, layer in calls.items()}
    if not errors[AUTOGEMM] <= TOLERANCE[dtype]:
        raise SystemExit(f"{model} {case} M={m} {dtype}: autogemm's result is off by {errors[AUTOGEMM]:.3g} "
                         f"(limit {TOLERANCE[dtype]:g}; torch eager: {errors[EAGER]:.3g})")
    timed = {name: (lambda layer=layer: layer(*args)) for name, layer in calls.items()}
    timed[GEMM_ALONE] = lambda: torch.matmul(x, w.T)
    row = {"model": model, "case": case, "m": m, "n": n // 2 if case == "swiglu" else n, "k": k, "dtype": dtype,
           "errors": errors, "served": autogemm_served(case, *args)}

    # torch.compile of the eager layer: one compile (dynamic shapes) per layer kind and dtype
    key = (case, dtype)
    if key not in compiled and compile_left[0] > 0:
        started = time.perf_counter()
        function = torch.compile(eager_layer(case), dynamic=True)
        try:
            function(*args)
            compiled[key] = function
        except Exception as exc:  # (a compile failure is reported, never fatal)
            compiled[key] = None
            print(f"torch.compile of {case} {dtype} failed: {type(exc).__name__}: {exc}", flush=True)
        compile_left[0] -= time.perf_counter() - started
    if compiled.get(key) is not None:
        function = compiled[key]
        timed[COMPILED] = lambda: function(*args)

    # cuBLASLt's own epilogue, checked against the form of GELU it computes
    try:
        lt_call, lt_handle, transposed = CublasLtLayer.make(case, *args)
    except Exception as exc:  # (nvmath missing or refusing the layout: reported in the row, the run goes on)
        lt_call, lt_handle, transposed = None, None, False
        row["cublaslt_error"] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"cuBLASLt through nvmath: {row['cublaslt_error']}", flush=True)
    if lt_call is not None:
        got = lt_call()
        got = got.T if transposed else got
        forms = {form: relative_error(got, reference(case, *args, gelu=form)) for form in ("gelu", "gelu_tanh")} \
            if case == "bias+gelu" else {"": relative_error(got, expected)}
        form = min(forms, key=forms.get)
        if not forms[form] <= TOLERANCE[dtype]:
            raise SystemExit(f"{model} {case} M={m} {dtype}: cuBLASLt's result is off by {forms[form]:.3g}")
        row["cublaslt_gelu"] = form
        timed[CUBLASLT] = lt_call
        if case == "bias+gelu" and form == "gelu_tanh":  # autogemm timed with the same activation
            same = autogemm_layer(case, "gelu_tanh")
            if relative_error(same(*args), reference(case, *args, gelu="gelu_tanh")) > TOLERANCE[dtype]:
                raise SystemExit(f"{model} {case} M={m} {dtype}: autogemm's gelu_tanh result is off")
            timed[AUTOGEMM + " (gelu_tanh)"] = lambda: same(*args)
    for call in timed.values():  # warm-up, as a loop would (plans settle within their first calls)
        for _ in range(8):
            call()
    torch.cuda.synchronize()
    latency = {name: statistics.median(values) * 1e3 for name, values in timing.latencies(timed, rounds=rounds).items()}
    row["latency_us"] = latency
    row["ratio"] = _ratios(latency)
    row["ceiling"] = latency[EAGER] / latency[GEMM_ALONE]
    if gpu_time_ms > 0:  # steady state, no host limit on anyone (the gate: autogemm/measure/timing.py)
        row["gpu_us"] = {name: timing.gpu_time(lambda i, call=call: call(), target_ms=gpu_time_ms).us
                         for name, call in timed.items()}
        row["gpu_ratio"] = _ratios(row["gpu_us"])
        row["gpu_ceiling"] = row["gpu_us"][EAGER] / row["gpu_us"][GEMM_ALONE]
    if lt_handle is not None:
        lt_handle.free()
    return row


def _ratios(times: dict) -> dict:
    """Each competitor's time / autogemm's (cuBLASLt's against autogemm with the GELU form it computes)."""
    ratio = {name: times[name] / times[AUTOGEMM] for name in (EAGER, COMPILED) if name in times}
    if CUBLASLT in times:
        ratio[CUBLASLT] = times[CUBLASLT] / times.get(AUTOGEMM + " (gelu_tanh)", times[AUTOGEMM])
    return ratio


def autogemm_served(case: str, x, w, bias, residual) -> str:
    """What served autogemm's GEMM (explain's source) and how the epilogue ran."""
    import autogemm

    keywords = {"bias+gelu": dict(bias=bias, activation="gelu"), "bias+silu": dict(bias=bias, activation="silu"),
                "residual": dict(residual=residual), "swiglu": dict(activation="silu", gated=True)}[case]
    said = autogemm.explain(x, w.T, **keywords)
    route = said.get("epilogue", {}).get("route", "pass")
    return f"{said['source']}{': ' + said['config'] if said.get('config') else ''}" + \
        (" + epilogue pass" if route == "pass" else f" with {route}")


def report(rows: list[dict], device, args, compile_spent: float, memo: str) -> list[str]:
    gpu = any("gpu_ratio" in r for r in rows)
    lines = [f"# Epilogues on {device.name}", "",
             f"`benchmarks/bench_epilogues.py` ({time.strftime('%Y-%m-%d')}): Llama-3 layer GEMMs with what follows "
             f"them, autogemm against torch eager (the GEMM, then the elementwise ops), cuBLASLt's own epilogue "
             "through nvmath-python where it has one, and torch.compile of the eager layer. Ratio: the "
             "competitor's time / autogemm's (> 1: autogemm is faster). Two figures, each taken the same way for "
             f"every competitor: **latency**, single calls on an idle GPU, host time included (medians of "
             f"{args.rounds} calls), which the acceptance judges"
             + (f"; and **GPU time**, back-to-back calls behind a gate so that no host limits anyone "
                f"(`timing.gpu_time`, {args.gpu_time_ms:g} ms a competitor)." if gpu else "."), ""]
    for figure, key in (("latency", "ratio"), ("GPU time", "gpu_ratio")):
        for name in (EAGER, CUBLASLT, COMPILED):
            ratios = [r[key][name] for r in rows if name in r.get(key, {})]
            if ratios:
                lines.append(f"- {figure} against {name}: geomean **{geomean(ratios):.3f}x** over {len(ratios)} "
                             f"problems (min {min(ratios):.3f}x, max {max(ratios):.3f}x)")
    for figure, key in (("latency", "ceiling"), ("GPU time", "gpu_ceiling")):
        ceilings = [r[key] for r in rows if key in r]
        if ceilings:
            lines.append(f"- {figure} ceiling (torch eager over the GEMM alone, `torch.matmul(x, w.T)` with no "
                         f"epilogue: the ratio a free epilogue on cuBLAS's GEMM would reach): geomean "
                         f"**{geomean(ceilings):.3f}x** (min {min(ceilings):.3f}x, max {max(ceilings):.3f}x)")
    lines.append(f"- torch.compile's compiles took {compile_spent:.0f} s in all")
    lines.append(f"- linear's C++ memo (serving/native_linear.py): {memo}")
    names = (EAGER, CUBLASLT, COMPILED)
    header = "| model | layer | M | N | K | dtype | autogemm us | eager | cuBLASLt | compile | ceiling |"
    rule = "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"
    if gpu:
        header += " GPU us | GPU eager | GPU cuBLASLt | GPU compile | GPU ceiling |"
        rule += " ---: | ---: | ---: | ---: | ---: |"
    lines += ["", header + " served |", rule + " --- |"]
    for r in rows:
        cells = [f"{r['ratio'][name]:.3f}x" if name in r["ratio"] else "-" for name in names]
        line = (f"| {r['model']} | {r['case']} | {r['m']} | {r['n']} | {r['k']} | {r['dtype']} | "
                f"{r['latency_us'][AUTOGEMM]:.1f} | " + " | ".join(cells) + f" | {_ceiling(r, 'ceiling')} |")
        if gpu:
            ratio = r.get("gpu_ratio", {})
            line += f" {r['gpu_us'][AUTOGEMM]:.1f} | " + " | ".join(
                f"{ratio[name]:.3f}x" if name in ratio else "-" for name in names) + f" | {_ceiling(r, 'gpu_ceiling')} |"
        lines.append(line + f" {r['served']} |")
    return lines


def _ceiling(row: dict, key: str) -> str:
    return f"{row[key]:.3f}x" if key in row else "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--ms", default=",".join(map(str, MS)), help="token counts M, comma-separated")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma-separated, of {', '.join(DTYPES)}")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"latency calls per competitor (default {ROUNDS})")
    parser.add_argument("--gpu-time-ms", type=float, default=GPU_TIME_MS,
                        help=f"GPU time of each competitor in steady state, ms of work (0: latency only; "
                             f"default {GPU_TIME_MS:g})")
    parser.add_argument("--compile-budget", type=float, default=COMPILE_BUDGET_S,
                        help=f"seconds of torch.compile in all; past it, no more compiles (default {COMPILE_BUDGET_S:g})")
    args = parser.parse_args(argv)
    models, cases = args.models.split(","), args.cases.split(",")
    dtypes_chosen = args.dtypes.split(",")
    try:
        ms = [int(v) for v in args.ms.split(",")]
    except ValueError:
        parser.error(f"--ms takes integers, got {args.ms!r}")
    for given, known, what in ((models, MODELS, "model"), (cases, CASES, "case"), (dtypes_chosen, DTYPES, "dtype")):
        unknown = [v for v in given if v not in known]
        if unknown:
            parser.error(f"unknown {what}(s) {', '.join(unknown)}: choose from {', '.join(known)}")
    if any(m < 1 for m in ms):
        parser.error("--ms must be positive")
    os.environ["AUTOGEMM_CACHE_DIR"] = tempfile.mkdtemp(prefix="autogemm-epilogues-")  # before autogemm is imported
    import torch

    from autogemm.gpu.launch import current_device

    if not torch.cuda.is_available():
        raise SystemExit("bench_epilogues needs PyTorch with CUDA")
    _, memo = build_linear_memo()
    print(f"linear's C++ memo: {memo}", flush=True)
    rows, compiled, compile_left = [], {}, [args.compile_budget]
    for model in models:
        for case in cases:
            for dtype in dtypes_chosen:
                for m in ms:
                    row = measure(model, case, m, dtype, args.rounds, compiled, compile_left, args.gpu_time_ms)
                    rows.append(row)
                    shown = "  ".join(f"{name} {value:.3f}x" for name, value in row["ratio"].items()) + (
                        "  | GPU time: " + "  ".join(f"{name} {value:.3f}x" for name, value in row["gpu_ratio"].items())
                        if "gpu_ratio" in row else "")
                    print(f"{model:<12}{case:<10} M={m:<5d}{dtype:<9} autogemm {row['latency_us'][AUTOGEMM]:8.1f} us  "
                          f"{shown}  [{row['served']}]", flush=True)
                    torch.cuda.empty_cache()
    device = current_device()
    spent = args.compile_budget - compile_left[0]
    published = (set(models), set(cases), set(ms), set(dtypes_chosen), args.rounds, args.gpu_time_ms) == \
        (set(MODELS), set(CASES), set(MS), set(DTYPES), ROUNDS, GPU_TIME_MS)
    path = results_path(f"epilogues-{device.slug}" + ("" if published else "-partial"))
    lines = report(rows, device, args, spent, memo)
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps({"device": device.name, "rounds": args.rounds, "gpu_time_ms": args.gpu_time_ms,
                                                     "rows": rows},
                                                    indent=1))
    print("\n".join(lines[:10]))
    print(f"written: {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
