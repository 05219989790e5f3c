"""The launch of the Hopper family's kernels ("tma"): A, B and (with a TMA store epilogue) C are
passed as tensor maps, which hold their addresses, so the launcher keeps each role's maps by address
(`tensor_maps.TensorMapCache`) and a call points the kernel's map arguments at the cached maps; and
the size of a persistent grid of clusters, which the driver knows (how many fit at once).

The layouts asked of the driver: A and B as stored, in the boxes a stage holds (K-major operands in
boxes of 64 K x the tile's rows, MN-major ones in boxes of 64 rows x bk), C in the boxes of one
consumer's store chunk; every map has the batch as its third dimension."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .. import dtypes
from . import tensor_maps
from ..kernels.compile import CompiledKernel, CompileError
from ..families import GemmConfig
from .operands import KernelOperand
from .packed_launch import (WORKSPACES, compiled_kernel, current_stream_pointer, epilogue_arguments,
                            native_description_of)
from .prepared import PreparedGemm
from ..problem import Problem
from .tensor_maps import MAP_DTYPE, TensorMapCache, TensorMapError, TiledLayout


def resident_clusters(kernel: CompiledKernel, threads: int, smem: int, cluster: int) -> int:
    """How many clusters of `cluster` blocks of this kernel the device holds at once, by the driver
    (a cluster's blocks share a GPC, so this is not simply SMs / cluster: a GPC with an odd number of
    free SMs leaves one idle)."""
    driver = tensor_maps.driver()  # cuda-bindings, as the tensor maps need it (a clear error without it)
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = smem
    result, count = driver.cuOccupancyMaxActiveClusters(driver.CUfunction(kernel.gemm.ptr), config)
    if result != driver.CUresult.CUDA_SUCCESS or count < 1:
        raise CompileError(f"{kernel.source.kernel}: no cluster of {cluster} blocks of {threads} threads and "
                           f"{smem} bytes of shared memory fits the device ({getattr(result, 'name', result)})",
                           "", None)
    return count


def operand_layout(problem: Problem, operand: KernelOperand, role: str, config: GemmConfig) -> tuple[TiledLayout, int]:
    """The tensor map layout of A or B as stored (innermost dimension first, then the other, then
    the batch) with the box a Hopper kernel copies, and the batch step (1: a matrix per batch, 0: one
    matrix the batch shares). K-major operands come in boxes of 64 K x the tile's rows (B's of a tile
    wider than a box's 256 rows: half of them, two boxes a slice), MN-major ones in boxes of 64 rows x bk."""
    row = dtypes.lookup(problem.dtype, problem.compute)
    itemsize = row.itemsize
    atom = config.swizzle_row_bytes // itemsize
    if role == "A":
        tile = config.tile_rows
        rows, length, mn_major = (problem.k, problem.m, True) if problem.trans_a else (problem.m, problem.k, False)
    else:
        tile = config.b_box_rows()
        rows, length, mn_major = (problem.n, problem.k, False) if problem.trans_b else (problem.k, problem.n, True)
    box = (atom, config.bk) if mn_major else (atom, tile)
    pitch = operand.ld * itemsize
    if operand.batch_stride:
        batch, stride, step = problem.batch, operand.batch_stride * itemsize, 1
    else:  # one matrix for the whole batch: a batch dimension of 1, which coordinate 0 always reads
        batch, stride, step = 1, pitch * rows, 0
    # (TF32 products read FP32 through TMA's TFLOAT32 type, which rounds to TF32 on the way in)
    return TiledLayout(_map_type(row, row.operand_map_type, role), itemsize, (length, rows, batch), (pitch, stride),
                       box + (1,)), step


def _map_type(row: dtypes.DType, element: str, role: str) -> str:
    """`element` (a tensor-map type of `row`), or TensorMapError where TMA does not copy the type."""
    if not element:
        copied = dict.fromkeys(r.name for r in dtypes.ROWS if r.tensor_map_type)
        raise TensorMapError(f"{role}: TMA copies {', '.join(copied)}, not {row.name}")
    return element


RECENT_MAPS = 8  # maps per operand role a TMA launcher switches between without asking its cache


def output_layout(problem: Problem, c: KernelOperand, config: GemmConfig) -> TiledLayout:
    """The tensor map layout of C (M x N row-major, then the batch; for an FP8 product D, of its output
    type) as a Hopper kernel's store epilogue writes it: boxes of one consumer's rows x one 128-byte row
    of columns. `problem` is
    the kernel's: where the config swaps the operands, C is its C^T (the kernel's M is C's N), and
    a box is the kernel's columns (wm of C's rows) by a 128-byte row of its rows (C's columns)."""
    row = dtypes.lookup(problem.dtype, problem.compute)
    if row.scaled:  # (FP8: C is D, of the epilogue's output type)
        row = dtypes.lookup(problem.epilogue.out_dtype)
    itemsize = row.itemsize
    atom = config.swizzle_row_bytes // itemsize
    pitch = c.ld * itemsize
    rows, columns = (problem.n, problem.m) if config.swaps_operands else (problem.m, problem.n)
    stride = c.batch_stride * itemsize if problem.batch > 1 else pitch * rows
    return TiledLayout(_map_type(row, row.tensor_map_type, "C"), itemsize, (columns, rows, problem.batch),
                       (pitch, stride), (atom, config.wm, 1))


def tma_launcher(prepared: PreparedGemm, a: KernelOperand, b: KernelOperand, c: KernelOperand, ordinal: int,
                 residual: KernelOperand | None = None) -> Any:
    """A Hopper kernel takes A and B as tensor maps, which hold their addresses: each role keeps the
    maps of the addresses it has seen (`TensorMapCache`), so a repeated call encodes none, and the
    launch reads the two map arguments straight from the cached maps (a changed address costs a
    pointer's write, not a copy). A split-K kernel also takes a workspace of partial sums and
    counters, from the per-stream pool of GPU `ordinal` (`HopperConfig.split_workspace`)."""
    problem, config = prepared.problem, prepared.config
    i32, i64 = np.int32, np.int64
    scalar = np.dtype(dtypes.lookup(problem.dtype, problem.compute).accumulator_storage).type  # alpha, beta
    layout_a, step_a = operand_layout(problem, a, "A", config)
    layout_b, step_b = operand_layout(problem, b, "B", config)
    maps_a, maps_b = TensorMapCache(layout_a, "A"), TensorMapCache(layout_b, "B")
    maps_c = TensorMapCache(output_layout(problem, c, config), "C") if config.tma_store else None
    blank = np.zeros(1, dtype=MAP_DTYPE)[0]
    kernel = compiled_kernel(prepared.kernel, "gemm", prepared.grid, prepared.block, prepared.smem, dict(
        map_a=blank, map_b=blank, map_c=blank, C=np.uintp(0), M=i32(problem.m), N=i32(problem.n), K=i32(problem.k),
        ldc=i32(c.ld), stride_c=i64(c.batch_stride), alpha=scalar(1), beta=scalar(0), batches=i32(problem.batch),
        batch_step_a=i32(step_a), batch_step_b=i32(step_b), c_mapped=i32(0), **epilogue_arguments(problem, residual),
        **({"partials": np.uintp(0), "counters": np.uintp(0)} if config.reduces_partial_sums else {}),
        **({"group_offsets": np.uintp(0), "groups": i32(problem.batch)} if problem.grouped else {})),
        dependent=config.dependent_launch)
    map_at = (kernel.index("map_a"), kernel.index("map_b"), kernel.index("map_c"))  # by operand role
    pointers, c_at = kernel.slot("C")
    # an epilogue's bias and residual: their addresses set at each launch (None: a bare kernel)
    bias_at, residual_at = kernel.slots("bias", "residual")[1] if "bias" in kernel.parameters else (None, None)
    # a scaled (FP8) product's scales: their addresses set at each launch too (None: an unscaled kernel)
    scale_a_at, scale_b_at = kernel.slots("scale_a", "scale_b")[1] if "scale_a" in kernel.parameters else (None, None)
    # block scales: whether they lie in torch's outer-dimension-major layout, set at each launch (None: no block scales)
    layouts, scales_outer_at = kernel.slot("scales_outer") if "scales_outer" in kernel.parameters else (None, None)
    scalars, (alpha_at, beta_at) = kernel.slots("alpha", "beta")
    flags, c_mapped_at = kernel.slot("c_mapped")
    # split-K: the partial sums and counters of the call's stream (None: a kernel that does not split K)
    partial_bytes, counter_bytes = config.split_workspace(problem, blocks=prepared.grid[0])
    partials_at, counters_at = kernel.slots("partials", "counters")[1] if partial_bytes else (None, None)
    # a grouped product's row offsets (on the GPU), set at each launch (None: not grouped)
    group_offsets_at = kernel.slot("group_offsets")[1] if problem.grouped else None
    get_workspace = WORKSPACES.get
    point, launch_kernel = kernel.point, kernel.launch
    lock = threading.Lock()
    current = [None, None, None]  # the addresses whose maps the arguments point at
    held = [None, None, None]  # those maps (kept alive while pointed at, even if their cache lets go)
    # per role, the maps of the addresses seen lately: switching back to one (layers alternating
    # weights) costs a dict lookup; the role's cache (its lock, its LRU order) is asked only for a
    # new address. False: a C that TMA cannot address (the kernel then writes from registers).
    recent = ({}, {}, {})
    caches = (maps_a, maps_b, maps_c)

    def switch(role: int, address: int) -> bool:
        found = recent[role].get(address)
        if found is None:
            try:
                found = caches[role].get(address)
            except TensorMapError:
                if role < 2:
                    raise
                found = False
            if len(recent[role]) >= RECENT_MAPS:
                recent[role].clear()
            recent[role][address] = found
        current[role] = address
        if found:
            held[role] = found[0]
            point(map_at[role], found[1])
            return True
        held[role] = None
        return False

    def launch(pa, pb, pc, alpha, beta, stream=None, pbias=0, presidual=0, pscale_a=0, pscale_b=0, poffsets=0,
               scales_outer=False):
        stream_pointer = current_stream_pointer(stream)
        if partials_at is not None:
            partial_sums = get_workspace(ordinal, stream_pointer, "split_k_partials", partial_bytes)
            tile_counters = get_workspace(ordinal, stream_pointer, "split_k_counters", counter_bytes, zeroed=True)
        with lock:
            if current[0] != pa:
                switch(0, pa)
            if current[1] != pb:
                switch(1, pb)
            if maps_c is not None and current[2] != pc:
                flags[c_mapped_at] = switch(2, pc)
            pointers[c_at] = pc
            if bias_at is not None:
                pointers[bias_at], pointers[residual_at] = pbias, presidual
            if scale_a_at is not None:
                pointers[scale_a_at], pointers[scale_b_at] = pscale_a, pscale_b
            if scales_outer_at is not None:
                layouts[scales_outer_at] = 1 if scales_outer else 0
            if partials_at is not None:
                pointers[partials_at], pointers[counters_at] = partial_sums, tile_counters
            if group_offsets_at is not None:
                pointers[group_offsets_at] = poffsets
            scalars[alpha_at], scalars[beta_at] = alpha, beta
            launch_kernel(stream_pointer)

    def encode(role: int, address: int) -> bytes | None:
        """The 128 bytes of the map of operand `role` (0 A, 1 B, 2 C) at `address`, from that role's cache; None
        where TMA cannot address it there (C: the kernel then writes from registers)."""
        try:
            return caches[role].get(address)[0].tobytes()
        except TensorMapError:
            return None

    def native_description(order: tuple[int, int] = (0, 1)) -> tuple | None:
        """What linear's C++ memo needs to make this launch itself (packed_launch.native_description_of's tuple:
        A, B and, with a TMA store, C as maps, from `encode`). None where a launch needs more than cuLaunchKernel
        and those arguments: a dependent grid, split-K's workspace, a grouped or scaled product, no epilogue."""
        if kernel.dependent or partials_at is not None or group_offsets_at is not None or scale_a_at is not None \
                or scales_outer_at is not None or bias_at is None:
            return None
        maps = ("map_a", "map_b", "map_c" if maps_c is not None else None)
        return native_description_of(kernel, scalar, order, launch, maps=maps, c_mapped="c_mapped", encode=encode)

    launch.native_description = native_description
    return launch
