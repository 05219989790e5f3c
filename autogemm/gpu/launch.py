"""Runs a configuration on CuPy operands: derives the problem and layouts from the arrays (the
operand model of `operands`), picks the vector widths their alignment allows, compiles (once) and
launches with the grid and launcher of the config's launch kind (`families.LaunchKind`; the table
`LAUNCHES`): "tiles", a block per output tile, batch and K split, with a split-K reduction kernel;
"split_k_fused", the same grid, the last block of each tile adding the splits up; "split_k_cluster",
the same grid, a tile's splits one thread-block cluster adding up in shared memory; "stream_k", a
persistent grid with a partial-sum workspace; "tma", a block per tile or a persistent grid, A and B
passed as tensor maps (`tma_launch`). Every launcher passes the kernel's arguments by the names of
its parameters (`packed_launch`)."""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from .. import dtypes
from ..epilogue import Epilogue
from . import runtime
from ..kernels.compile import CompiledKernel, CompileError, compile_source
from ..families import GemmConfig, LaunchKind, VectorWidths
from .operands import KernelOperand, describe, real_scalar, validate
from .packed_launch import WORKSPACES, compiled_kernel, current_stream_pointer, epilogue_arguments
from .prepared import PreparedGemm
from ..problem import Device, Problem
from ..kernels.render import render
from .repack import repacking_launcher
from .tma_launch import resident_clusters, tma_launcher

REDUCE_THREADS = 256
REDUCE_GRID_MAX = 65535  # blocks of the split-K reduction (it loops over the rest)
WORKSPACE_ROW_ALIGN = 4  # partial-sum rows padded to 4 elements, so they are stored as vectors


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


def gemm(config: GemmConfig, a, b, c=None, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0, stream=None):
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


def resolve(config: GemmConfig, a, b, c, *, trans_a: bool = False, trans_b: bool = False,
            alpha: float = 1.0, beta: float = 0.0, described=None) -> Call:
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


def bind(config: GemmConfig, a, b, c=None, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0, epilogue: Epilogue | None = None, bias=None, residual=None):
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
             ordinal: int | None = None, residual: KernelOperand | None = None):
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


def _scalar_type(problem: Problem):
    """NumPy type of alpha, beta and split-K partials."""
    return np.dtype(dtypes.lookup(problem.dtype, problem.compute).accumulator_storage).type


def _gemm_arguments(prepared: PreparedGemm, a: KernelOperand, b: KernelOperand, c: KernelOperand,
                    residual: KernelOperand | None = None) -> dict:
    """The arguments every tiled GEMM kernel takes (`families.base`), by name: A, B and C (their
    pointers set per launch), sizes, pitches, batch strides, alpha and beta (set per launch), and
    the K tiles per split; with an epilogue, its bias and residual (pointers set per launch) and
    the residual's pitch and batch stride (common.cuh.j2's epilogue_parameters)."""
    problem = prepared.problem
    i32, i64, ptr, scalar = np.int32, np.int64, np.uintp, _scalar_type(problem)
    arguments = dict(A=ptr(0), B=ptr(0), C=ptr(0), M=i32(problem.m), N=i32(problem.n), K=i32(problem.k),
                     lda=i32(a.ld), ldb=i32(b.ld), ldc=i32(c.ld), stride_a=i64(a.batch_stride),
                     stride_b=i64(b.batch_stride), stride_c=i64(c.batch_stride), alpha=scalar(1), beta=scalar(0),
                     tiles_per_split=i32(prepared.tiles_per_split))
    return {**arguments, **epilogue_arguments(problem, residual)}


def _direct_launcher(prepared: PreparedGemm, a: KernelOperand, b: KernelOperand, c: KernelOperand, ordinal: int,
                     residual: KernelOperand | None = None):
    """One kernel writing C itself: no split, or a split-K cluster adding its splits up."""
    kernel = compiled_kernel(prepared.kernel, "gemm", prepared.grid, prepared.block, prepared.smem,
                             _gemm_arguments(prepared, a, b, c, residual))
    pointers, (a_at, b_at, c_at) = kernel.slots("A", "B", "C")
    scalars, (alpha_at, beta_at) = kernel.slots("alpha", "beta")
    launch_kernel, lock = kernel.launch, threading.Lock()
    if not prepared.problem.epilogue.is_identity:
        _, (bias_at, residual_at) = kernel.slots("bias", "residual")

        def launch_with_epilogue(pa, pb, pc, alpha, beta, stream=None, pbias=0, presidual=0):
            stream_pointer = current_stream_pointer(stream)
            with lock:
                pointers[a_at], pointers[b_at], pointers[c_at] = pa, pb, pc
                pointers[bias_at], pointers[residual_at] = pbias, presidual
                scalars[alpha_at], scalars[beta_at] = alpha, beta
                launch_kernel(stream_pointer)

        return launch_with_epilogue

    def launch(pa, pb, pc, alpha, beta, stream=None):
        stream_pointer = current_stream_pointer(stream)
        with lock:
            pointers[a_at], pointers[b_at], pointers[c_at] = pa, pb, pc
            scalars[alpha_at], scalars[beta_at] = alpha, beta
            launch_kernel(stream_pointer)

    return launch


def _tiles_launcher(prepared: PreparedGemm, a: KernelOperand, b: KernelOperand, c: KernelOperand, ordinal: int,
                    residual: KernelOperand | None = None):
    """A block per tile; with split-K, the splits' partial sums go to a workspace from the
    per-stream pool, which the reduction kernel adds up into C (alpha and beta applied there)."""
    if prepared.config.split_k == 1:
        return _direct_launcher(prepared, a, b, c, ordinal, residual)
    problem, config = prepared.problem, prepared.config
    m, n, batch = problem.m, problem.n, problem.batch
    i32, i64, ptr, scalar = np.int32, np.int64, np.uintp, _scalar_type(problem)
    ldw = -(-n // WORKSPACE_ROW_ALIGN) * WORKSPACE_ROW_ALIGN
    stride_w = m * ldw
    workspace_bytes = batch * config.split_k * stride_w * np.dtype(scalar).itemsize
    kernel = compiled_kernel(prepared.kernel, "gemm", prepared.grid, prepared.block, prepared.smem,
                             {**_gemm_arguments(prepared, a, b, c), "ldc": i32(ldw), "stride_c": i64(stride_w)})
    reduce_grid = (min(-(-(batch * m * n) // REDUCE_THREADS), REDUCE_GRID_MAX), 1, 1)
    reduce = compiled_kernel(prepared.kernel, "reduce", reduce_grid, (REDUCE_THREADS, 1, 1), 0, dict(
        W=ptr(0), C=ptr(0), M=i32(m), N=i32(n), ldw=i32(ldw), stride_w=i64(stride_w), ldc=i32(c.ld),
        stride_c=i64(c.batch_stride), batch=i32(batch), alpha=scalar(1), beta=scalar(0)))
    pointers, (a_at, b_at, w_at) = kernel.slots("A", "B", "C")
    reduce_pointers, (reduce_w_at, reduce_c_at) = reduce.slots("W", "C")
    scalars, (alpha_at, beta_at) = reduce.slots("alpha", "beta")
    lock, get_workspace = threading.Lock(), WORKSPACES.get

    def launch_split(pa, pb, pc, alpha, beta, stream=None):
        stream_pointer = current_stream_pointer(stream)
        workspace = get_workspace(ordinal, stream_pointer, "split_k", workspace_bytes)
        with lock:
            pointers[a_at], pointers[b_at], pointers[w_at] = pa, pb, workspace
            reduce_pointers[reduce_w_at], reduce_pointers[reduce_c_at] = workspace, pc
            scalars[alpha_at], scalars[beta_at] = alpha, beta
            kernel.launch(stream_pointer)
            reduce.launch(stream_pointer)

    return launch_split


def _stream_k_launcher(prepared: PreparedGemm, a: KernelOperand, b: KernelOperand, c: KernelOperand, ordinal: int):
    """The stream-K kernel takes the plain kernel's arguments (no K tiles per split: it deals the
    iterations out itself), the batch and a workspace: two BM x BN partial-sum slots per block and
    a counter per tile, which must be zero at launch (the kernel leaves them zero again). Both come
    from the per-stream pool, so concurrent calls on different streams never share one."""
    problem, config = prepared.problem, prepared.config
    tiles = config.output_tiles(problem) * problem.batch
    partial_bytes = 2 * prepared.grid[0] * config.bm * config.bn * np.dtype(_scalar_type(problem)).itemsize
    counter_bytes = tiles * 4
    kernel = compiled_kernel(prepared.kernel, "gemm", prepared.grid, prepared.block, prepared.smem, {
        **_gemm_arguments(prepared, a, b, c), "tiles_per_split": np.int32(0), "batches": np.int32(problem.batch),
        "partials": np.uintp(0), "counters": np.uintp(0)})
    return _launch_with_workspace(kernel, ordinal, ("stream_k_partials", partial_bytes),
                                  ("stream_k_counters", counter_bytes))


def _fused_split_launcher(prepared: PreparedGemm, a: KernelOperand, b: KernelOperand, c: KernelOperand,
                          ordinal: int, residual: KernelOperand | None = None):
    """A split-K kernel that adds its splits up itself takes the plain kernel's arguments and a
    workspace: a BM x BN slot of partial sums per block, and a counter per output tile (and batch)
    that must be zero at launch (the tile's last block sets it back to zero). Both come from the
    per-stream pool, so concurrent calls on different streams never share one."""
    problem, config = prepared.problem, prepared.config
    tiles = config.output_tiles(problem) * problem.batch
    partial_bytes = tiles * config.split_k * config.bm * config.bn * np.dtype(_scalar_type(problem)).itemsize
    counter_bytes = tiles * 4
    kernel = compiled_kernel(prepared.kernel, "gemm", prepared.grid, prepared.block, prepared.smem, {
        **_gemm_arguments(prepared, a, b, c, residual), "partials": np.uintp(0), "counters": np.uintp(0)})
    return _launch_with_workspace(kernel, ordinal, ("split_k_partials", partial_bytes),
                                  ("split_k_counters", counter_bytes))


def _launch_with_workspace(kernel, ordinal: int, partials: tuple[str, int], counters: tuple[str, int]):
    """`launch(pa, pb, pc, alpha, beta, stream)` of a kernel that takes A, B and C, alpha and beta,
    and a partial-sum workspace and tile counters that must be zero at launch (`partials` and
    `counters`): each a (purpose, bytes) buffer of the per-stream pool."""
    pointers, (a_at, b_at, c_at, partials_at, counters_at) = kernel.slots("A", "B", "C", "partials", "counters")
    scalars, (alpha_at, beta_at) = kernel.slots("alpha", "beta")
    lock = threading.Lock()
    get_workspace = WORKSPACES.get
    (partials_purpose, partial_bytes), (counters_purpose, counter_bytes) = partials, counters
    if "bias" in kernel.parameters:  # (an epilogue's pointers, set per launch too)
        _, (bias_at, residual_at) = kernel.slots("bias", "residual")

        def launch_with_epilogue(pa, pb, pc, alpha, beta, stream=None, pbias=0, presidual=0):
            stream_pointer = current_stream_pointer(stream)
            partial_sums = get_workspace(ordinal, stream_pointer, partials_purpose, partial_bytes)
            tile_counters = get_workspace(ordinal, stream_pointer, counters_purpose, counter_bytes, zeroed=True)
            with lock:
                pointers[a_at], pointers[b_at], pointers[c_at] = pa, pb, pc
                pointers[partials_at], pointers[counters_at] = partial_sums, tile_counters
                pointers[bias_at], pointers[residual_at] = pbias, presidual
                scalars[alpha_at], scalars[beta_at] = alpha, beta
                kernel.launch(stream_pointer)

        return launch_with_epilogue

    def launch(pa, pb, pc, alpha, beta, stream=None):
        stream_pointer = current_stream_pointer(stream)
        partial_sums = get_workspace(ordinal, stream_pointer, partials_purpose, partial_bytes)
        tile_counters = get_workspace(ordinal, stream_pointer, counters_purpose, counter_bytes, zeroed=True)
        with lock:
            pointers[a_at], pointers[b_at], pointers[c_at] = pa, pb, pc
            pointers[partials_at], pointers[counters_at] = partial_sums, tile_counters
            scalars[alpha_at], scalars[beta_at] = alpha, beta
            kernel.launch(stream_pointer)

    return launch


def _tile_grid(config: GemmConfig, problem: Problem, kernel: CompiledKernel, smem: int, device: Device):
    return config.grid(problem)


def _stream_k_grid(config: GemmConfig, problem: Problem, kernel: CompiledKernel, smem: int, device: Device):
    """As many blocks as the device holds at once (more would wait for a second wave; the kernel
    deals the work out over whatever the grid is)."""
    from cupy.cuda import driver  # (lazy: CuPy)

    per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.gemm.ptr, config.threads, smem)
    return (max(1, per_sm * device.sm_count), 1, 1)


def _tma_grid(config: GemmConfig, problem: Problem, kernel: CompiledKernel, smem: int, device: Device):
    """A cluster per work unit, or a persistent grid of as many clusters as the driver says are
    resident at once (`HopperConfig.grid_blocks`)."""
    resident = resident_clusters(kernel, config.threads, smem, config.cluster) if config.cluster > 1 else None
    return (config.grid_blocks(problem, device, resident), 1, 1)


@dataclass(frozen=True)
class KindLaunch:
    """How the kernels of one launch kind run: the grid of the launch (config, kernel problem,
    compiled kernel, shared memory, device) and the launcher of the kernel(s) (prepared kernel, A,
    B and C in the kernel's roles, the GPU's ordinal)."""

    grid: Callable[[GemmConfig, Problem, CompiledKernel, int, Device], tuple[int, int, int]]
    launcher: Callable[[PreparedGemm, KernelOperand, KernelOperand, KernelOperand, int], Callable]


LAUNCHES: dict[LaunchKind, KindLaunch] = {
    LaunchKind.TILES: KindLaunch(_tile_grid, _tiles_launcher),
    LaunchKind.SPLIT_K_FUSED: KindLaunch(_tile_grid, _fused_split_launcher),
    LaunchKind.SPLIT_K_CLUSTER: KindLaunch(_tile_grid, _direct_launcher),  # (a cluster writes C itself)
    LaunchKind.STREAM_K: KindLaunch(_stream_k_grid, _stream_k_launcher),
    LaunchKind.TMA: KindLaunch(_tma_grid, tma_launcher),
}


def launch_of(config: GemmConfig) -> KindLaunch:
    """The grid and launcher of the config's launch kind; ValueError for a kind autogemm has none for."""
    try:
        return LAUNCHES[config.launch_kind]
    except KeyError:
        raise ValueError(f"config {config.name} asks for launch kind {config.launch_kind!r}; autogemm launches "
                         f"{', '.join(LAUNCHES)}") from None
