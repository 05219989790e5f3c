"""Runs a configuration on CuPy operands: derives the problem and layouts from the arrays (the
operand model of `operands`), picks the vector widths their alignment allows, compiles (once) and
launches with the grid and launcher of the config's launch kind (`kind_launch`: its table
`LAUNCHES`), operands copied to aligned pitches first where the config repacks them (`repack`)."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, replace
from typing import Any

from ..epilogue import Epilogue
from . import runtime
from ..kernels.compile import CompileError, compile_source
from ..families import GemmConfig, VectorWidths
from .kind_launch import launch_of
from .operands import KernelOperand, describe, real_scalar, validate
from .prepared import PreparedGemm
from ..problem import Device, Problem
from ..kernels.render import render
from .repack import repacking_launcher



@functools.lru_cache(maxsize=None)
def device_info(ordinal: int) -> Device:
    return Device.current(ordinal)


def current_device() -> Device:
    import cupy  # (lazy: CuPy)

    return device_info(cupy.cuda.Device().id)


def compute_for(config: GemmConfig, dtype: str) -> str:
    """The compute mode a family implies for a dtype (the tensor-core family on float32: TF32)."""
    compute = config.compute_for(dtype)
    if compute is None:
        raise TypeError(f"the {config.label} family has no kernel for {dtype}; it computes {config.computes_names()}")
    return compute


def prepare(config: GemmConfig, problem: Problem, widths: VectorWidths | None = None,
            device: Device | None = None) -> PreparedGemm:
    device = device or current_device()
    reasons = config.check(problem, device)
    if reasons:
        raise ValueError(f"config {config.name} cannot run {problem}: " + "; ".join(reasons))
    source = render(config, problem, widths)
    problem = config.kernel_problem(problem)  # from here on: the product the kernel computes
    smem = config.smem_bytes(problem)
    kernel = compile_source(source, device.arch, smem)
    if config.register_cap and kernel.local_bytes:
        # an explicit register cap is allowed somewhat under the estimate; where ptxas had to spill
        # under it, the kernel is not worth running
        raise CompileError(f"{source.kernel}: spills to local memory ({kernel.local_bytes} bytes per thread) "
                           f"under max_registers={config.register_cap}", "", None)
    grid = launch_of(config).grid(config, problem, kernel, smem, device)
    return PreparedGemm(config=config, problem=problem, kernel=kernel, grid=grid, block=(config.threads, 1, 1),
                        smem=smem, tiles_per_split=config.tiles_per_split(problem))


def gemm(config: GemmConfig, a: Any, b: Any, c: Any = None, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0, stream: Any = None) -> Any:
    """C = alpha * op(A) @ op(B) + beta * C with the kernel of `config`; returns C.

    `a` is stored M×K (or K×M with trans_a), `b` K×N (or N×K with trans_b), each 2-D or 3-D
    (a 2-D operand is shared by every matrix of the batch), rows of unit stride. C is M×N
    row-major and is allocated when not given (then beta is ignored). bfloat16 operands may be
    uint16 arrays of the raw bits.
    """
    run, c = bind(config, a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
    run(stream)
    return c


@dataclass(frozen=True)
class Call:
    """A GEMM call resolved against a config, without touching the GPU: the problem it is (None when
    there is nothing to multiply: M, N or K is 0), the vector widths the operands' alignment allows,
    and the operands as the kernel reads them."""

    problem: Problem | None
    widths: VectorWidths | None
    a: KernelOperand
    b: KernelOperand
    c: KernelOperand
    k: int


def _describe_ab(config: GemmConfig, a, b, trans_a: bool, trans_b: bool):
    """A and B as stored, op(A) and op(B) as validation sees them, and the compute mode."""
    info_a, info_b = describe(a, "A", bfloat16_bits=True), describe(b, "B", bfloat16_bits=True)
    compute = compute_for(config, info_a.dtype)
    return info_a, info_b, info_a.transposed() if trans_a else info_a, info_b.transposed() if trans_b else info_b, compute


def resolve(config: GemmConfig, a: Any, b: Any, c: Any, *, trans_a: bool = False, trans_b: bool = False,
            alpha: float = 1.0, beta: float = 0.0, described: Any = None) -> Call:
    """Validates the operands of `gemm` (C given) for `config`; raises TypeError/ValueError naming
    the fault. `described`: A and B as `_describe_ab` read them, where the caller has."""
    info_a, info_b, op_a, op_b, compute = described or _describe_ab(config, a, b, trans_a, trans_b)
    info_c = describe(c, "C", bfloat16_bits=True)
    shape, _ = validate(op_a, op_b, info_c, alpha, beta, compute)
    m, n = shape[-2:]
    k = op_a.shape[-1]
    a_, b_, c_ = info_a.storage(trans_a), info_b.storage(trans_b), info_c.storage(False)
    if min(m, n, k) == 0:
        return Call(None, None, a_, b_, c_, k)
    problem = Problem(m, n, k, batch=shape[0] if len(shape) == 3 else 1, dtype=info_a.dtype, compute=compute,
                      trans_a=trans_a, trans_b=trans_b)
    return Call(problem, config.vector_widths(a_, b_, c_, info_a.itemsize), a_, b_, c_, k)


def bind(config: GemmConfig, a: Any, b: Any, c: Any = None, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0, epilogue: Epilogue | None = None, bias: Any = None, residual: Any = None) -> Any:
    """Validates the operands, compiles the kernel and returns (run, c): `run(stream=None)`
    launches it with every argument prepared, for repeated calls (timing, tuning). With an
    `epilogue` (its family must apply one), C = act(alpha * op(A) @ op(B) + bias) + residual +
    beta * C in the operands' dtype: `bias` of N values (or M, for an epilogue whose bias runs along
    M), `residual` of C's shape and dtype with unit-stride rows (an out_dtype or a gated epilogue is
    `matmul`'s to serve)."""
    cupy = runtime.cupy()
    alpha, beta = real_scalar(alpha, "alpha"), real_scalar(beta, "beta")
    described = _describe_ab(config, a, b, trans_a, trans_b)
    if c is None:
        _, _, op_a, op_b, compute = described
        shape, _ = validate(op_a, op_b, None, alpha, 0.0, compute)
        c = cupy.empty(shape, dtype=a.dtype)
        beta = 0.0
    call = resolve(config, a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, described=described)
    if call.problem is None:
        if c.size == 0:
            return (lambda stream=None: None), c

        def scale(stream=None):  # no products: C = beta * C, and beta == 0 must not propagate what C held
            with stream if stream is not None else contextlib.nullcontext():
                if beta == 0:
                    c.fill(0)
                else:
                    c[...] *= beta
        return scale, c

    if epilogue is not None and not epilogue.is_identity:
        return _bind_epilogue(config, call, c, alpha, beta, epilogue, bias, residual)
    launch = launcher(prepare(config, call.problem, call.widths), call.a, call.b, call.c)

    def run(stream=None):
        launch(call.a.pointer, call.b.pointer, call.c.pointer, alpha, beta, stream)

    return run, c


def _bind_epilogue(config: GemmConfig, call: Call, c, alpha: float, beta: float, epilogue: Epilogue, bias, residual):
    """`bind` of a problem with an epilogue: its bias and residual checked against C (ValueError or
    TypeError naming the fault), then the kernel rendered with the epilogue and launched with their
    pointers."""
    if epilogue.out_dtype or epilogue.gated:
        raise ValueError(f"bind writes C in the operands' dtype, one column per output: the epilogue {epilogue} is "
                         "matmul's to serve")
    problem = replace(call.problem, epilogue=epilogue)
    infos = {}  # the given bias and residual, described
    for name, given, wanted in (("bias", bias, epilogue.bias), ("residual", residual, epilogue.residual)):
        if not wanted:
            if given is not None:
                raise ValueError(f"the epilogue {epilogue} takes no {name}, and one was given")
            continue
        if given is None:
            raise ValueError(f"the epilogue {epilogue} adds a {name}: give it")
        info = infos[name] = describe(given, name, bfloat16_bits=True)
        if info.dtype != problem.dtype:
            raise TypeError(f"{name} is {info.dtype}; C is {problem.dtype}")
    if "bias" in infos:
        info, length = infos["bias"], problem.n if epilogue.bias == "n" else problem.m
        if len(info.shape) != 1 or info.shape[0] != length or (length > 1 and info.strides[0] != info.itemsize):
            raise ValueError(f"bias must be a contiguous vector of {length} values (along {epilogue.bias.upper()}); "
                             f"got shape {info.shape}, strides {info.strides}")
    residual_operand = None
    if "residual" in infos:
        c_shape = tuple(describe(c, "C", bfloat16_bits=True).shape)
        if tuple(infos["residual"].shape) != c_shape:
            raise ValueError(f"residual must have C's shape {c_shape}; got {tuple(infos['residual'].shape)}")
        residual_operand = infos["residual"].storage(False)
    launch = launcher(prepare(config, problem, call.widths), call.a, call.b, call.c, residual=residual_operand)
    pbias, presidual = (infos[name].pointer if name in infos else 0 for name in ("bias", "residual"))

    def run(stream=None):
        launch(call.a.pointer, call.b.pointer, call.c.pointer, alpha, beta, stream, pbias, presidual)

    return run, c


def launcher(prepared: PreparedGemm, a: KernelOperand, b: KernelOperand, c: KernelOperand,
             ordinal: int | None = None, residual: KernelOperand | None = None) -> Any:
    """`launch(pa, pb, pc, alpha, beta, stream)` for operands of these pitches and batch strides
    (their pointers are given at each launch): every other argument is packed once, here, and a
    workspace comes from the per-stream pool (`packed_launch`). A config that repacks misaligned
    operands copies them first (`repack`). `ordinal`: the GPU whose workspaces the launches use
    (None: the current device). A problem with an epilogue (autogemm.epilogue) launches as
    `launch(pa, pb, pc, alpha, beta, stream, pbias, presidual)`: the bias's and the residual's
    pointers (0 where the epilogue has none), the residual of the pitch and batch stride of
    `residual` (in the user's layout, as C; a kernel that writes C transposed reads it so too)."""
    refusal = prepared.config.epilogue_refusal(prepared.problem.epilogue)
    if refusal:
        raise ValueError(f"config {prepared.config.name} is not launched with the epilogue {prepared.problem.epilogue}: "
                         f"{refusal}")
    if ordinal is None:
        import cupy  # (lazy: CuPy)

        ordinal = cupy.cuda.Device().id
    if prepared.config.swaps_operands:
        # C^T = B^T A^T: the kernel's first operand is B, its second A (`prepared.problem` is swapped)
        inner = _operand_launcher(prepared, b.in_other_role(), a.in_other_role(), c, ordinal, residual)

        def launch_swapped(pa, pb, pc, alpha, beta, stream=None, *epilogue_pointers):
            inner(pb, pa, pc, alpha, beta, stream, *epilogue_pointers)

        describe = getattr(inner, "native_description", None)
        if describe is not None:  # (the first pointer takes the kernel's second operand role)
            launch_swapped.native_description = lambda: describe((1, 0))
        return launch_swapped
    return _operand_launcher(prepared, a, b, c, ordinal, residual)


def _operand_launcher(prepared: PreparedGemm, a: KernelOperand, b: KernelOperand, c: KernelOperand, ordinal: int,
                      residual: KernelOperand | None = None):
    """`launcher` for A and B in the kernel's own roles: copied to aligned pitches first where the
    config repacks them."""
    kind_launcher = launch_of(prepared.config).launcher
    if not prepared.problem.epilogue.is_identity:  # (only the kinds of configs that apply one take the residual)
        kind_launcher = functools.partial(kind_launcher, residual=residual)
    if prepared.config.repacks_operands:
        return repacking_launcher(prepared, a, b, c, kind_launcher, ordinal)
    return kind_launcher(prepared, a, b, c, ordinal)
