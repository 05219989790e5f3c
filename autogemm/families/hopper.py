"""The Hopper family (`hopper_gemm.cu.j2`, sm_90a): FP16, BF16, TF32 and FP8 GEMM fed by the Tensor Memory
Accelerator, the way the public Hopper GEMMs that beat cuBLAS are built.

A block has one producer warpgroup, whose first thread asks TMA for both operands' K slices (tensor
maps the launcher encodes on the host, `tensor_maps`) into a ring of `stages` shared-memory stages
under the 128-byte swizzle, and `bm / wm` (1 or 2) consumer warpgroups, each owning wm x bn of the
bm x bn tile and issuing wgmma.mma_async with both operands read from shared memory (registers hold
only accumulators). An mbarrier per stage counts the bytes in, another the consumers out. With
`persistent` the grid is one block per SM and each block takes tile after tile, its producer
filling the ring for the next tile while the consumers write the last one out. Every layout is
read as it is stored: wgmma's transpose bits take MN-major 16-bit operands.

With `cluster` 2, pairs of blocks take vertically adjacent tiles and the first multicasts B's slices
into both (B crosses from L2 once per pair); with `cluster_n` 2, blocks also take horizontally adjacent
tiles and the first of a row multicasts A's slices (a cluster of up to 2 x 2 tiles). With `tma_store`,
the consumers stage their results in shared memory in 64-column chunks that TMA writes to C while they
start the next tile (beta != 0 and a C that TMA cannot address take the direct path from registers).
With `pingpong` the two consumers do not share a tile but take turns on wm x bn tiles, one's epilogue
under the other's wgmmas. With `split_k` > 1 each tile's K slices are dealt out to that many work units
(for few tiles and a long K: decode); each leaves FP32 partial sums in a workspace, and the one that
counts last on the tile's counter adds them up in split order and writes C (`split_workspace`). With
`stream_k` the grid's blocks (one per SM) take whole waves of tiles, then share out the K slices of the
tiles that a last wave would leave partly empty in equal runs (families/stream_k.py says how): a tile
that several runs share is added up as split-K's are, from a slot per run. With `fast_activation` a GELU
or SiLU epilogue takes the epilogue pass's cheaper forms (hopper_rules.fast_activation_reasons says
why).

TF32: the operands' tensor maps are of TMA's TFLOAT32 type, which rounds FP32 to TF32 as it copies
(to nearest: cuBLAS's accuracy, where wgmma reading raw FP32 bits would truncate them). wgmma reads
TF32 from shared memory K-major only, so an A stored K x M is read into registers (wgmma's A from
registers) and a B stored K x N needs `swap` (C^T = B^T A^T, the kernel writing C transposed, with
`tma_store` in transposed chunks); layout TN has K contiguous in neither operand and is not served
in TF32. `swap` is a knob for the 16-bit types too (any layout).

TMA needs 16-byte aligned addresses and pitches, so an operand that is not is copied to an aligned
pitch first (`repack`); tails need nothing (TMA fills zeros past the matrices' edges).

FP8 (its own space, `hopper_fp8`): wgmma m64nNk32 with both operands K-major (layout NT), the scales
and D's type in the epilogue (per tensor, per row; per block with each 128 of K's partial sums promoted
into FP32), D stored from registers or through TMA (`_fp8_reasons` says what else it asks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .. import dtypes
from ..problem import Device, Problem
from . import gemv, hopper_rules, wgmma
from .base import INT32_MAX, GemmConfig, VectorizedLoads, VectorWidths, cxx_bool
from .hopper_knobs import KNOBS
from .hopper_rules import MAX_BLOCK_SCALED_VALUES, MAX_CONSUMERS, MAX_GROUPS, TMA_ALIGN_BYTES
from .launch_kind import LaunchKind
from .hopper_work import HopperWork
from .stream_k import PREFIX_TAILS_PER_BLOCK

ARCH = wgmma.ARCH  # TMA, mbarrier transactions and wgmma: compute capability 9.0, compiled for sm_90a
WARPGROUP = wgmma.WARPGROUP
ROWS_PER_INSTRUCTION = wgmma.ROWS_PER_INSTRUCTION  # wgmma's M
SWIZZLE_BYTES = wgmma.SWIZZLE_BYTES  # a shared-memory row of a tile (a TMA box row)
SWIZZLE_PERIOD_BYTES = wgmma.SWIZZLE_PERIOD_BYTES
STORE_BUFFERS = 2  # store chunks per consumer: one filled while TMA reads the other
SPLIT_N_STORE_BUFFERS = 1  # ... except where two consumers split N: one chunk of all rows they share
# a consumer's accumulators: beyond 128 floats per thread the registers setmaxnreg gives a
# consumer (232 with two consumers) no longer hold them with the addresses and loop state
MAX_ACCUMULATORS = 128
# ... except where two consumers split the tile's columns (wm = bm, wn = bn / 2): a 192 x 96 share's
# 3 x 48 compile without spills (nvcc 13, sm_90a: tests/test_hopper_split_n.py), in the 168 registers a
# thread that ptxas reports for 384 threads. 192 x 192 is the tile cuBLAS runs as
# nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB on LLM prefill products on an H200.
MAX_SPLIT_N_ACCUMULATORS = 144
# ... and a consumer of two m64 blocks wider than 128 columns (128 x 144: two of them make a 256 x 144 tile, the
# shape of cuBLAS's nvjet_sm90_hsh_256x144_64x4_2x1 swapped, seen on an H200 at FP16 1000 x 4544 x 18176: 126 tiles,
# one wave, where 128 x 256 makes 144; unswapped, 1024 x 9216 takes 256, 1.94 waves of 132 SMs, where 256 x 128
# takes 288). Its 2 x 72 compile without spills in the 168 registers a thread except where hopper_rules.tall_reasons
# says (nvcc 13, sm_90a: tests/test_hopper_tall.py). Tiles of at most 128 columns keep 128, so that the kernels the
# limit renders into a static_assert stay the same
MAX_TALL_ACCUMULATORS, TALL_WIDTH = 144, 128
# ... and a wide tile's consumer (64 x 320: two wgmmas of 256 and 64 columns; cuBLAS's 320 x 128 tile on BF16
# products of 4096 rows and more on an H200)
MAX_WIDE_ACCUMULATORS = 160
BARRIER_BYTES = 8  # an mbarrier
# split-K's "counted last" flag per consumer: a static shared array, which the dynamic block's alignment
# to the swizzle period pads to a whole period
SPLIT_FLAGS_BYTES = SWIZZLE_PERIOD_BYTES
# registers per thread after setmaxnreg with two consumers: the producer gives up what the
# consumers take (128 x 40 + 256 x 232 = 384 x 168, the block's share under __launch_bounds__)
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 40, 232
GROUP_TILES_BYTES = -(-(MAX_GROUPS + 1) * 4 // SWIZZLE_PERIOD_BYTES) * SWIZZLE_PERIOD_BYTES

class HopperConfig(HopperWork, VectorizedLoads, GemmConfig):
    family = "hopper"
    family_applies_epilogue = True  # (in its store, from the accumulators: templates/common.cuh.j2)
    applies_scales = True  # (FP8: the scales in the epilogue, D written in its out_dtype)
    takes_grouped = True  # (groups of rows by offsets on the GPU: templates/hopper_gemm.cu.j2, `grouped`)
    seeds_by_waves = True  # (its tiles decide how 132 SMs fill: families/waves.py)
    label = "Hopper"
    name_prefix = "hopper_"
    knobs = KNOBS
    if TYPE_CHECKING:  # the knobs' fields as type checkers see them: knobs.knob_fields(KNOBS), checked by tests
        bm: int = 128
        bn: int = 256
        bk: int = 64
        wm: int = 64
        wn: int = 256
        stages: int = 4
        group_m: int = 8
        split_k: int = 1
        min_blocks: int = 1
        persistent: bool = True
        cluster: int = 1
        cluster_n: int = 1
        tma_store: bool = False
        pingpong: bool = False
        swap: bool = False
        stream_k: bool = False
        stmatrix: bool = False
        fast_activation: bool = False
        preload: bool = False
        hoisted_descriptors: bool = False
        dependent_launch: bool = False
    template = "hopper_gemm.cu.j2"
    arch_suffix = wgmma.ARCH_SUFFIX
    launch_kind = LaunchKind.TMA
    swizzle_row_bytes = SWIZZLE_BYTES  # a TMA box row (the launcher's boxes are this wide)
    space_constants: ClassVar[dict[str, Any]] = {"WARPGROUP": WARPGROUP, "MAX_ACCUMULATORS": MAX_ACCUMULATORS,
                                                  "MAX_WIDE_ACCUMULATORS": MAX_WIDE_ACCUMULATORS,
                                                  "MAX_TALL_ACCUMULATORS": MAX_TALL_ACCUMULATORS}
    search_space = "hopper"
    candidate_order = 1  # searched after the dtype's own space

    @classmethod
    def candidate_for(cls, problem: Problem, device: Device | None = None) -> bool:
        """The types the family computes (the `other_families` column of dtypes) on a device of its
        architecture (any where no device is given), where the product is not GEMV-like (those are
        the GEMV family's: a Hopper tile of 64 rows and more would mostly compute padding) unless
        the type is the family's own (FP8, which nothing else computes)."""
        own = dtypes.lookup(problem.dtype, problem.compute).family == cls.family  # (FP8: no other family computes it)
        return (cls.compute_for(problem.dtype) == problem.compute and (own or not gemv.is_short(problem))
                and (device is None or device.compute_capability == ARCH))

    @classmethod
    def supersedes(cls, problem: Problem, device: Device | None = None) -> tuple[str, ...]:
        """On an sm_90 device, the tensor-core family for FP16 and BF16 (whose every layout wgmma's
        transpose bits read as stored): on an H200 it won none of the shipped document's 16-bit problems
        against this family or cuBLAS, and a tune that searched both gave it half the budget. TF32 keeps
        both (this family does not serve layout TN in TF32)."""
        if device is not None and device.compute_capability == ARCH and cls.transposes(problem):
            return ("wmma",)
        return ()

    @classmethod
    def space_for(cls, problem: Problem) -> str:
        """hopper.toml for the types it computes besides their own family; the row's own space (FP8:
        hopper_fp8.toml) for the types whose family it is."""
        row = dtypes.lookup(problem.dtype, problem.compute)
        return row.space if row.family == cls.family else cls.search_space

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def swaps_operands(self) -> bool:
        return self.swap is True

    @staticmethod
    def transposes(problem: Problem) -> bool:
        """Whether wgmma's transpose bits serve MN-major operands (16-bit types; not TF32)."""
        shapes = dtypes.lookup(problem.dtype, problem.compute).tensor_core
        return shapes is not None and shapes.wgmma_transposes

    def a_in_registers(self, problem: Problem) -> bool:
        """Whether the consumers read A into registers (wgmma's A from registers): TF32 with the
        kernel's A stored K x M. `problem` is the kernel's (`kernel_problem`)."""
        return problem.trans_a and not self.transposes(problem)

    def fragment_registers(self, problem: Problem) -> int:
        """A's fragments a consumer thread holds with A from registers: two slices of 4 per m64
        block and k-step. `problem` is the kernel's."""
        if not self.a_in_registers(problem):
            return 0
        k_step = dtypes.lookup(problem.dtype, problem.compute).tensor_core.wgmma_k
        return 2 * (self.wm // ROWS_PER_INSTRUCTION) * (self.bk // k_step) * 4

    @property
    def vec(self) -> int:
        """Elements per 16 bytes (TMA's alignment), for the repacking of misaligned operands."""
        return TMA_ALIGN_BYTES // 2

    @property
    def consumers(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn) if self.wm and self.wn else 0

    @property
    def split_n(self) -> bool:
        """Whether the consumers split the tile's columns (each owns all bm rows and wn of the bn
        columns) rather than its rows."""
        return self.wn < self.bn

    @property
    def threads(self) -> int:
        return (self.consumers + 1) * WARPGROUP

    @property
    def tile_rows(self) -> int:
        """Rows of a work tile (and of A's slice in a stage): a consumer's with `pingpong`, else the
        block's."""
        return self.wm if self.pingpong else self.bm

    @property
    def repacks_operands(self) -> bool:
        return True

    def reduce_kernel(self, kernel: str) -> str | None:
        return None  # (split-K: the splits are added up by the kernel itself)

    def smem_bytes(self, problem: Problem) -> int:
        """The ring's stages (both operands' tiles), with `tma_store` two store chunks of 64 columns
        per consumer, with block scales on one set of partial sums each stage's scales (A's of the work
        tile's rows, B's of two blocks of columns, rounded to 16 bytes), with a staged bias each consumer's
        tile's bias (stages_bias, rounded to 16 bytes), a full and an empty barrier per stage, and one swizzle
        period of slack to align the first stage (the dynamic base is not aligned)."""
        itemsize = dtypes.lookup(problem.dtype, problem.compute).itemsize
        store = self.bm * self.store_buffers() * SWIZZLE_BYTES if self.tma_store else 0
        scales = self.stages * (self.tile_rows + 4) * 4 if self.stages_block_scales(problem) else 0
        bias = self.consumers * -(-self.bn * itemsize // 16) * 16 if self.stages_bias(problem) else 0
        return (self.stages * (self.tile_rows + self.bn) * self.bk * itemsize + store + scales + bias
                + 2 * self.stages * BARRIER_BYTES + SWIZZLE_PERIOD_BYTES)

    def store_buffers(self) -> int:
        """The TMA store's chunk buffers of a consumer (with split N, of both: they share them)."""
        return SPLIT_N_STORE_BUFFERS if self.split_n else STORE_BUFFERS

    def accumulators(self) -> int:
        """Accumulators per consumer thread: wm / 64 wgmma blocks of wn / 2."""
        return self.wm // ROWS_PER_INSTRUCTION * self.wn // 2

    def max_accumulators(self) -> int:
        """The most accumulators a consumer thread may hold (MAX_SPLIT_N_ACCUMULATORS says why split N
        differs)."""
        if self.wide:
            return MAX_WIDE_ACCUMULATORS
        if self.split_n:
            return MAX_SPLIT_N_ACCUMULATORS
        return MAX_TALL_ACCUMULATORS if self.tall_and_wide else MAX_ACCUMULATORS

    @property
    def tall_and_wide(self) -> bool:
        """Whether a consumer holds two or more m64 blocks of more than 128 columns (MAX_TALL_ACCUMULATORS)."""
        return self.wm > ROWS_PER_INSTRUCTION and self.wn > TALL_WIDTH

    @property
    def wide(self) -> bool:
        """Whether the tile is wider than one wgmma (256 columns): each consumer issues two."""
        return self.bn > wgmma.N_MAX

    def wgmma_pieces(self) -> tuple[int, ...]:
        """The columns of each wgmma a consumer issues per m64 block and k-step: one of wn, or a wide tile's
        256 and the rest (the second starting on one of B's 64-column boxes)."""
        return (wgmma.N_MAX, self.wn - wgmma.N_MAX) if self.wide else (self.wn,)

    def b_box_rows(self) -> int:
        """The rows of B's K-major TMA box: bn, or a wide tile's half (a box holds at most 256 rows)."""
        return self.bn // 2 if self.wide else self.bn

    def registers(self) -> tuple[int, int]:
        """setmaxnreg's (producer, consumer) registers; (0, 0): none (one consumer has 255)."""
        return (PRODUCER_REGISTERS, CONSUMER_REGISTERS) if self.consumers == MAX_CONSUMERS else (0, 0)

    # ---- validity ------------------------------------------------------------------------------
    def check(self, problem: Problem, device: Device) -> list[str]:
        """Every reason this configuration cannot run `problem` on `device` (empty: it can)."""
        reasons, bad = self.first_reasons(problem)
        if reasons:
            return reasons
        if problem.grouped:
            hopper_rules.grouped_reasons(self, problem, bad)
        if device.compute_capability != ARCH:
            bad("tensor-core", f"TMA and wgmma need compute capability {ARCH[0]}.{ARCH[1]} (sm_90a), "
                               f"device is {device.arch}")
        row = dtypes.lookup(problem.dtype, problem.compute)
        # the problem whose layout the kernel reads (row and block scales, and grouped products, refuse swap in
        # their rules: the problem is not swapped to find the layout's reasons; a grouped one has no swapped form)
        kernel = problem if self.swap and (problem.grouped or row.scaled and problem.epilogue.scale in ("row", "block")) \
            else self.kernel_problem(problem)
        hopper_rules.tile_reasons(self, problem, kernel, bad)
        if row.scaled:
            hopper_rules.fp8_reasons(self, problem, bad)
        hopper_rules.layout_reasons(self, problem, kernel, bad)
        if self.work_units(problem) > INT32_MAX:
            bad("grid", f"{self.work_units(problem)} work units (tiles x split_k={self.split_k}) exceed the kernel's "
                        "32-bit count")
        hopper_rules.switched_knob_reasons(self, problem, device, bad)
        if self.min_blocks != 1:
            bad("occupancy", f"min_blocks={self.min_blocks}: a Hopper block takes a whole SM")
        if self.threads > device.max_threads_per_block:
            bad("threads", f"{self.threads} threads per block exceed the device limit {device.max_threads_per_block}")
        # (split-K's flags are static shared memory, beside the dynamic block the launch reserves)
        smem = self.smem_bytes(problem) + (SPLIT_FLAGS_BYTES if self.reduces_partial_sums else 0) + \
            (GROUP_TILES_BYTES if problem.grouped else 0)
        if smem > device.smem_per_block_optin:
            bad("shared-memory", f"{smem} bytes of shared memory ({self.stages} stages) exceed the device limit "
                                 f"{device.smem_per_block_optin}")
        self.launch_reasons(problem, device, smem, bad)
        return reasons

    def stages_block_scales(self, problem: Problem) -> bool:
        """Whether each stage holds its slice's block scales, copied by the producer warp (block scales on one set
        of partial sums, whose promotion cannot wait for the consumers' own loads: templates/hopper_gemm.cu.j2,
        copy_block_scales)."""
        return problem.epilogue.scale == "block" and self.block_scaled_sets() == 1

    def stages_bias(self, problem: Problem) -> bool:
        """Whether each consumer copies its tile's bias along N into shared memory of its own (BN values, 16 bytes
        a piece, asynchronously) when it starts the tile, so that its epilogue reads the bias there, into the TMA
        store's chunks or from registers (templates/hopper_gemm.cu.j2, stage_bias). With `preload`, a bias along N
        and the consumers' own stores (no swap, stmatrix or split N), one unit a tile (no split-K, stream-K or
        group): ptxas loaded a chunk's bias from global memory one value after the other, each waiting for the one
        before to be used (the SASS of 128 x 192, 256 x 128 ping-pong and 256 x 144 tiles with a bias, BF16 NT: a
        chain of 9-11 of its 16 loads a chunk), where the staged bias costs a shared-memory load a pair of
        columns."""
        return (self.preload and problem.epilogue.bias == "n" and not self.swap
                and not self.stmatrix and not self.split_n and self.split_k == 1 and not self.stream_k
                and not problem.grouped and not dtypes.lookup(problem.dtype, problem.compute).scaled)

    def block_scaled_sets(self) -> int:
        """Block scales: how many sets of partial sums the consumer's registers hold beside its
        accumulators: two (one slice promoted while the next one's wgmmas run) where they fit, else one
        (each slice waited for, then promoted, under the other consumer's wgmmas), else none."""
        for sets in (2, 1):
            if (sets + 1) * self.accumulators() <= MAX_BLOCK_SCALED_VALUES:
                return sets
        return 0

    # ---- rendering -----------------------------------------------------------------------------
    def check_widths(self, widths: VectorWidths) -> None:
        if (widths.a, widths.b) != (self.vec, self.vec):
            raise ValueError(f"Hopper kernels read A and B through TMA at {TMA_ALIGN_BYTES}-byte alignment "
                             f"(widths {self.vec}), not {widths}")

    def context(self, problem: Problem, widths: VectorWidths) -> dict[str, Any]:
        if self.compute_for(problem.dtype) != problem.compute:
            raise ValueError(f"the Hopper template has no kernel for {problem.dtype}/{problem.compute}")
        row = dtypes.lookup(problem.dtype, problem.compute)
        producer, consumer = self.registers()
        # C's type: the element's, or for FP8 products D's (the epilogue's EpOut and its conversions)
        c_type, c_to_acc, c_from_acc = ("EpOut", "epilogue_to_acc", "epilogue_from_acc") if row.scaled \
            else ("T", "to_acc", "from_acc")
        return dict(
            scaled=row.scaled, c_type=c_type, c_to_acc=c_to_acc, c_from_acc=c_from_acc,
            block_scaled=problem.epilogue.scale == "block",
            block_sets=self.block_scaled_sets() if problem.epilogue.scale == "block" else 0,
            staged_scales=self.stages_block_scales(problem), staged_bias=self.stages_bias(problem),
            dtype=problem.dtype, compute=problem.compute, layout=problem.layout.upper(), element=row.element,
            to_acc=row.to_acc, from_acc=row.from_acc, mma_input=row.tensor_core.mma_input, fk=row.tensor_core.wgmma_k,
            bm=self.bm, bn=self.bn, bk=self.bk, consumers=self.consumers, split_n=self.split_n, cn=self.wn,
            wide=self.wide, pieces=self.wgmma_pieces(), b_box_rows=self.b_box_rows(),
            max_accumulators=self.max_accumulators(), stages=self.stages, group_m=self.group_m,
            trans_a=cxx_bool(problem.trans_a), b_mn_major=cxx_bool(not problem.trans_b),
            transposes=self.transposes(problem), a_in_registers=self.a_in_registers(problem),
            c_transposed=cxx_bool(self.swaps_operands),
            swizzle_bytes=SWIZZLE_BYTES, swizzle_period=SWIZZLE_PERIOD_BYTES, smem_bytes=self.smem_bytes(problem),
            store_buffers=self.store_buffers(),
            producer_registers=producer, consumer_registers=consumer, cluster=self.cluster, cluster_n=self.cluster_n,
            tma_store=cxx_bool(self.tma_store), pingpong=cxx_bool(self.pingpong), split_k=self.split_k,
            stream_k=self.stream_k, prefix_tails_per_block=PREFIX_TAILS_PER_BLOCK, stmatrix=self.stmatrix,
            fast_activation=self.fast_activation, preload=self.preload, hoisted_descriptors=self.hoisted_descriptors,
            dependent_launch=self.dependent_launch,
            grouped=problem.grouped, max_groups=MAX_GROUPS,
            **self.even_flags(problem),
        )
