"""The launch kinds of the GEMM families (`families.LaunchKind`), each with its grid and launcher
(the table `LAUNCHES`): "tiles", a block per output tile, batch and K split, with a split-K reduction
kernel; "split_k_fused", the same grid, the last block of each tile adding the splits up;
"split_k_cluster", the same grid, a tile's splits one thread-block cluster adding up in shared
memory; "stream_k", a persistent grid with a partial-sum workspace; "tma", a block per tile or a
persistent grid, A and B passed as tensor maps (`tma_launch`). Every launcher passes the kernel's
arguments by the names of its parameters (`packed_launch`), an epilogue's among them."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import dtypes
from ..families import GemmConfig, LaunchKind
from ..kernels.compile import CompiledKernel
from ..problem import Device, Problem
from .operands import KernelOperand
from .packed_launch import (WORKSPACES, compiled_kernel, current_stream_pointer, epilogue_arguments,
                            native_description_of)
from .prepared import PreparedGemm
from .tma_launch import resident_clusters, tma_launcher

REDUCE_THREADS = 256
REDUCE_GRID_MAX = 65535  # blocks of the split-K reduction (it loops over the rest)
WORKSPACE_ROW_ALIGN = 4  # partial-sum rows padded to 4 elements, so they are stored as vectors


def _scalar_type(problem: Problem):
    """NumPy type of alpha, beta and split-K partials."""
    return np.dtype(dtypes.lookup(problem.dtype, problem.compute).accumulator_storage).type


def _gemm_arguments(prepared: PreparedGemm, a: KernelOperand, b: KernelOperand, c: KernelOperand,
                    residual: KernelOperand | None = None) -> dict[str, Any]:
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

        # (linear's C++ memo makes this launch itself where a tune kept the kernel: A and B go as pointers)
        launch_with_epilogue.native_description = lambda order=(0, 1): None if kernel.dependent else \
            native_description_of(kernel, _scalar_type(prepared.problem), order, launch_with_epilogue)
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
    blocks = config.cluster_blocks  # (only the Hopper family launches this kind: HopperConfig.cluster_blocks)
    resident = resident_clusters(kernel, config.threads, smem, blocks) if blocks > 1 else None
    return (config.grid_blocks(problem, device, resident), 1, 1)


@dataclass(frozen=True)
class KindLaunch:
    """How the kernels of one launch kind run: the grid of the launch (config, kernel problem,
    compiled kernel, shared memory, device) and the launcher of the kernel(s) (prepared kernel, A,
    B and C in the kernel's roles, the GPU's ordinal)."""

    grid: Callable[[GemmConfig, Problem, CompiledKernel, int, Device], tuple[int, int, int]]
    launcher: Callable[[PreparedGemm, KernelOperand, KernelOperand, KernelOperand, int], Callable[..., Any]]


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
