"""`explain()`: which kernel `matmul` would run for some operands, and why, without running it (the
same validation, NumPy semantics and selection as `dispatch.matmul`, the plan memo's races and guard
verdicts of this process included)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from . import call_context, dispatch, epilogue_step, numpy_semantics
from ..families import config_from_name
from ..gpu import launch, runtime
from .numpy_semantics import KERNELS
from ..gpu.cublas_epilogue import LT_BARE, lt_rank_name
from ..gpu.eager_route import bias_in_linear, eager_computes, pass_follows
from .eager_epilogue import tuned_bias_in_pass
from ..gpu.operands import check_scalars, describe, real_scalar, validate
from ..problem import Problem
from .fused_epilogue import tuned_kernel
from .race import race_choice
from .select import ChoiceSource
from .torch_tensors import is_tensor, to_cupy


def explain(a: Any, b: Any, *, out: Any = None, alpha: float = 1.0, beta: float = 0.0, compute: str | None = None,
            tune: bool | None = None, race: bool | None = None, bias: Any = None, activation: str | None = None,
            residual: Any = None, out_dtype: Any = None, gated: bool = False) -> dict[str, Any]:
    """Which kernel `matmul(a, b, ...)` would run, and why: the source of the choice, the config,
    the figures cached with it and the candidates the model weighed (each with its predicted ratio
    to cuBLAS and the ratio it needed); with racing on, the race's figures once a call has run it
    (`race`: None before). Also the result's `shape` and `dtype` (NumPy's), the operands converted
    to that dtype (`conversions`) and copied (`copies`: strides no kernel reads, or a broadcast
    batch no single stride walks; "out" where out overlaps an operand and the product goes through
    a temporary), and how the result reaches `out` (`out`: None without one). It takes matmul's
    arguments and refuses what matmul refuses, with the same errors. A call that cupy.matmul
    serves (integer, boolean or complex operands) says so: `source` "cupy.matmul", the reason, no
    problem. `source` is one of select.ChoiceSource's strings. Runs nothing (but may compile the
    chosen kernel). `cached` has the record's figures as the tune measured them: GPU times of the
    kernel and the faster baseline, single-call latencies, each baseline's GPU time, and the timing
    protocol; `guard`, the online guard's verdict once one was reached in this process."""
    runtime.cupy()
    if bias is not None or activation is not None or residual is not None or out_dtype is not None or gated:
        return _explain_epilogue(a, b, out, alpha, beta, compute, tune, race, bias, activation, residual, out_dtype,
                                 gated)
    if is_tensor(a) or is_tensor(b) or is_tensor(out):
        a, b, out = to_cupy(a, "a"), to_cupy(b, "b"), to_cupy(out, "out")
    alpha, beta = real_scalar(alpha, "alpha"), real_scalar(beta, "beta")  # (as matmul checks them)
    operands = numpy_semantics.read(a, "a"), numpy_semantics.read(b, "b")
    operand_out = numpy_semantics.read(out, "out", output=True) if out is not None else None
    call = numpy_semantics.plan(*operands, operand_out)
    check_scalars(alpha, beta, out is not None)
    overlapped = numpy_semantics.overlapping(operand_out, *operands) if out is not None else []
    device_id = call_context.device_of(operands[0])
    device = launch.device_info(device_id)
    shown = {"shape": call.shape, "dtype": None if call.dtype is None else call.dtype.name,
             "out": _writing_out(call, operand_out, overlapped)}
    if call.served_by != KERNELS:
        return {"problem": None, "device": device.name, "source": ChoiceSource.CUPY_MATMUL.value, "config": None,
                "reason": call.reason, "candidates": [], "race": None, "copies": [], "conversions": [],
                "cached": None, **shown}
    if call.takes_as_given(*operands, operand_out) and not overlapped:
        ia, ib = describe(a, "a"), describe(b, "b")
        io = describe(out, "out", output=True) if out is not None else None
        copied = []
    else:  # as numpy_semantics.run would shape them (plan() has checked out)
        (ia, _, copied_a), (ib, _, copied_b) = (numpy_semantics.kernel_info(x, call, device_id) for x in operands)
        io, copied = None, [x.name for x, flag in ((ia, copied_a), (ib, copied_b)) if flag]
    shape, compute = validate(ia, ib, io, alpha, beta if io is not None else 0.0, compute)
    layout_a, layout_b = ia.layout(), ib.layout()
    trans_a = layout_a.transposed if layout_a else False
    trans_b = layout_b.transposed if layout_b else False
    m, n = shape[-2:]
    problem = Problem(max(m, 1), max(n, 1), max(ia.shape[-1], 1), batch=max(shape[0], 1) if len(shape) == 3 else 1,
                      dtype=ia.dtype, compute=compute, trans_a=trans_a, trans_b=trans_b)
    choice = dispatch._DISPATCHER.select(problem, device, bool(tune))
    racing = call_context.env_flag(race, "AUTOGEMM_RACE")
    raced = dispatch._DISPATCHER.races.get((device.slug, problem.key)) if racing else None
    if raced is not None and choice.record is None:
        choice = race_choice(choice, raced)
    choice, _ = dispatch._DISPATCHER.with_verdict(choice, device, problem)
    record = choice.record
    return {
        "problem": problem.key,
        "device": device.name,
        "source": choice.source.value,  # (the plain string: a printed explain() shows 'cache', not the enum)
        "config": choice.config.name if choice.config else None,
        "reason": choice.reason,
        "candidates": choice.details.get("candidates", []),
        "race": choice.details.get("race"),
        "guarded": choice.guarded,
        "guard": choice.details.get("guard"),
        "copies": copied + [x.name for x, lay in ((ia, layout_a), (ib, layout_b)) if lay is None]
        + (["out"] if overlapped else []),
        "conversions": [f"{x.name}: {x.dtype.name} -> {call.dtype.name}" for x in operands if x.dtype != call.dtype],
        "cached": None if record is None else {
            "problem": record.problem, "tflops": record.tflops, "cublas_tflops": record.cublas_tflops,
            "ratio": record.ratio, "date": record.date, "rel_error": record.rel_error,
            "protocol": record.protocol, "gpu_us": record.time_ms * 1e3, "baseline_gpu_us": record.cublas_ms * 1e3,
            "latency_us": record.latency_us or None, "baseline_latency_us": record.baseline_latency_us or None,
            "latency_ratio": record.latency_ratio, "baselines_us": {k: v * 1e3 for k, v in record.baselines.items()},
        },
        **shown,
    }


def _writing_out(call, out, overlapped: list[str]) -> str | None:
    """How the result reaches `out` (None: there is none), as numpy_semantics.run writes it."""
    if out is None:
        return None
    if call.served_by != KERNELS:
        return f"cupy.matmul's result is written into out ({out.dtype.name})"
    if overlapped:
        return (f"out overlaps {' and '.join(overlapped)}: the product is computed into a temporary, then "
                "copied into out (as NumPy computes it)")
    if out.dtype != call.dtype:
        return f"the {call.dtype.name} result is computed apart, then cast to out's {out.dtype.name}"
    if numpy_semantics.out_layout(out, call) is None:
        return "the result is computed apart, then written into out (no single stride walks its batch axes)"
    return "written into out directly"


def _tuned_with(gemm: dict[str, Any], epilogue) -> tuple[Any, ...]:
    """What a tune of the explained GEMM's problem with `epilogue` found (fused_epilogue.tuned_kernel):
    (whether one did, the config it kept or None)."""
    if not gemm.get("problem") or epilogue.out_dtype or epilogue.gated:
        return False, None
    problem = dataclasses.replace(Problem.from_key(gemm["problem"]), epilogue=epilogue)
    return tuned_kernel(dispatch._DISPATCHER, problem, launch.current_device())


def _explain_epilogue(a, b, out, alpha, beta, compute, tune, race, bias, activation, residual, out_dtype,
                      gated) -> dict[str, Any]:
    """explain of a call with an epilogue: the same checks as matmul's (dispatch.check_epilogue_call),
    then the GEMM's explanation, with `epilogue` saying what follows it and `dtype` D's."""
    epilogue_step.epilogue_of(bias, activation, residual, out_dtype, gated)  # (the keywords' names first)
    tensors = is_tensor(a) and is_tensor(b) and out is None and beta == 0
    a, b, out, bias, residual = (to_cupy(x, name) if is_tensor(x) else x for x, name in
                                 ((a, "a"), (b, "b"), (out, "out"), (bias, "bias"), (residual, "residual")))
    epilogue, _ = dispatch.check_epilogue_call(a, b, out, alpha, beta, bias, activation, residual, out_dtype, gated)
    if epilogue.is_identity:  # (out_dtype named the products' own dtype, and nothing else was asked)
        return explain(a, b, out=out, alpha=alpha, beta=beta, compute=compute, tune=tune, race=race)
    gemm = explain(a, b, alpha=alpha, compute=compute, tune=tune, race=race)
    applied, route = "after the GEMM, in one elementwise pass (epilogue_step)", "pass"
    # where the bias is added (None: there is none): in the pass, the kernel's store, F.linear's call or cuBLASLt's
    # epilogue (on F.linear's route it decides which GEMM call runs: with the bias, or the bare one)
    bias_at = "pass" if bias is not None else None
    lt = epilogue_step.lt_epilogue(epilogue, gemm["dtype"])
    config = config_from_name(gemm["config"]) if gemm.get("config") else None
    tuned, kept = _tuned_with(gemm, epilogue)
    rank = epilogue_step.tuned_lt_rank(
        dispatch._DISPATCHER, dataclasses.replace(Problem.from_key(gemm["problem"]), epilogue=epilogue),
        launch.current_device()) if tuned and kept is None and lt is not None and gemm.get("problem") else 0
    if kept is not None and tensors and not gemm.get("copies"):
        applied += (f"; from the second such call on PyTorch tensors, in the store of the kernel a tune with this "
                    f"epilogue kept ({kept.name})")
        route = f"fused {kept.name} (tuned with the epilogue)"
        bias_at = bias_at and "kernel"
    elif not tuned and config is not None and tensors and not config.epilogue_refusal(epilogue) \
            and not gemm.get("copies") \
            and (gemm.get("guard") or {}).get("kernel_won", not gemm.get("guarded")):
        applied += (f"; from the second such call on PyTorch tensors, in the store of the kernel that serves the GEMM "
                    f"({config.name})")
        route = f"fused {config.name}"
        bias_at = bias_at and "kernel"
    elif rank and tensors and config is None and len(gemm.get("shape") or ()) == 2:
        which = "the algorithm its heuristic picks for the GEMM alone" if rank == LT_BARE else \
            f"its heuristic's algorithm #{rank + 1}"
        applied += (f"; from the second such call on PyTorch tensors, inside cuBLAS's GEMM (cuBLASLt's {lt} epilogue, "
                    f"through {which}, which the layer's tune timed faster than the heuristic's first and the other "
                    f"routes)")
        route = f"cuBLASLt {lt} {lt_rank_name(rank)}"
        bias_at = bias_at and "cuBLASLt"
    elif tensors and config is None and eager_computes(
            epilogue, gemm["dtype"], b.ndim, None if bias is None else bias.ndim, a.ndim,
            all(x is None or x.dtype == a.dtype for x in (b, bias, residual))):
        whole = not pass_follows(epilogue)  # (the bias alone: F.linear's own)
        rows = math.prod(gemm["shape"][:-1]) if gemm.get("shape") else 0
        in_pass = tuned and gemm.get("problem") and tuned_bias_in_pass(
            dispatch._DISPATCHER, dataclasses.replace(Problem.from_key(gemm["problem"]), epilogue=epilogue),
            launch.current_device())
        applied += ("; from the second such call on PyTorch tensors, by PyTorch's own GEMM call (F.linear" +
                    (" with the bias, its cuBLASLt call prepared once where the operands suit: lt_linear)" if whole
                     else (" with the bias" if bias_in_linear(epilogue, rows) and not in_pass else
                           ", the bias in the pass as its tune measured faster" if in_pass else
                           ", the bias in the pass (one token: F.linear would copy it into the output first)"
                           if epilogue.bias else "") +
                     ", then the pass over its output in place)") +
                    "; `linear`'s repeated calls make eager's own calls from C++ where its memo is built (native_linear)")
        route = "F.linear" if whole else "F.linear + pass"
        bias_at = bias_at and ("F.linear" if whole or (bias_in_linear(epilogue, rows) and not in_pass) else "pass")
    elif lt is not None and tensors and config is None and len(gemm.get("shape") or ()) == 2:
        applied += f"; from the second such call on PyTorch tensors, inside cuBLAS's GEMM (cuBLASLt's {lt} epilogue)"
        route = f"cuBLASLt {lt}"
        bias_at = bias_at and "cuBLASLt"
    return {**gemm, "dtype": epilogue.output_dtype(gemm["dtype"]),
            "shape": epilogue_step.result_shape(gemm["shape"], epilogue) if gemm.get("shape") else gemm.get("shape"),
            "epilogue": {"key": epilogue.key, "applied": applied, "route": route, "bias": bias_at},
            "out": None if out is None else f"D written into out{' (beta · out added)' if beta else ''}"}
