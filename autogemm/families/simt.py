"""The SIMT family: FP32 GEMM on CUDA cores (FFMA), template `simt_gemm.cu.j2`.

A block tile BM x BN x BK is split into warp tiles WM x WN, each lane computing a TM x TN thread
tile from fragments it reads out of shared memory (both operands held K-major there, so that a
fragment is one vector load). The knobs below say what each one does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .. import dtypes
from ..problem import REGISTERS_PER_BLOCK, Device, Problem
from .base import MAX_REGISTERS_PER_THREAD, REGISTER_GRANULE, WARP, GemmConfig, VectorizedLoads, VectorWidths, cxx_bool, grid_knobs, tile_knobs
from .knobs import Knob
from .launch_kind import LaunchKind

VECTOR_WIDTHS = (1, 2, 4)  # floats per global or shared-memory access (4 = 16 bytes)
FIRST_ASYNC_STAGE = 3  # stages 1-2 stage slices in registers; from 3 on they are a cp.async ring
MAX_STAGES = 8  # a deeper ring of any useful tile does not fit a block's shared memory
MAX_THREAD_TILE = 64  # outputs per lane along M or N: more accumulators than registers
SMEM_PAD_FLOATS = 4  # one 16-byte vector: keeps LDS.128 aligned and shifts each row by 4 banks
STREAM_K_STATIC_SMEM = 16  # the flag telling a block it finishes a shared tile (stream-K, fused split-K)
MAX_CLUSTER = 8  # blocks of a thread-block cluster that every sm_90 part can schedule (portable size)
CLUSTER_CAPABILITY = (9, 0)  # thread-block clusters and distributed shared memory

KNOBS = (
    *tile_knobs(128, 128, 8, 32, 64, low=2, why="fragments are double-buffered per k pair"),
    # thread tile: outputs per lane, in vec_frag-wide chunks spread across the warp tile
    Knob("tm", int, 8, code="t", power_of_two=True, low=1, high=MAX_THREAD_TILE),
    Knob("tn", int, 8, join="x", power_of_two=True, low=1, high=MAX_THREAD_TILE),
    # width of global loads, and of shared-memory fragment loads (4 = LDS.128)
    Knob("vec", int, 4, code="v", choices=VECTOR_WIDTHS),
    Knob("vec_frag", int, 4, join="", choices=VECTOR_WIDTHS),
    # 1 single buffer, 2 double buffer with register prefetch, >= 3 a cp.async ring
    Knob("stages", int, 2, code="s", low=1, high=MAX_STAGES),
    # layout of an operand whose shared-memory store is a transpose: padded rows or XOR swizzle
    Knob("smem", str, "pad", choices=("plain", "pad", "swizzle")),
    *grid_knobs(),
    # how the cp.async ring brings in a transposed operand: 4-byte cp.async per element, or vector
    # loads into registers at the top of a slice, stored transposed before its closing barrier
    Knob("transpose", str, "async", choices=("async", "registers"), omitted="async", words={"registers": "r"}),
    # a persistent grid: whole waves of tiles, then the last partial wave's (tile, K slice)
    # iterations shared out evenly, blocks sharing a tile adding up through a workspace
    Knob("stream_k", bool, False, omitted=False, words={True: "sk"}),
    # an explicit register cap (__maxnreg__), at most the one min_blocks implies; 0: that one
    Knob("max_registers", int, 0, code="reg", low=16, high=MAX_REGISTERS_PER_THREAD, omitted=0, why="automatic"),
    # how split-K adds up its partial sums: a workspace and a second kernel; a workspace and the
    # tile's last block ("fused": one launch); or (sm_90) the blocks of a tile as one thread-block
    # cluster, adding up through distributed shared memory
    Knob("split_reduce", str, "kernel", choices=("kernel", "fused", "cluster"), omitted="kernel",
         words={"fused": "fr", "cluster": "cr"}),
    # copy an A or B whose pitch (or address) is not a multiple of the vector width to an aligned
    # pitch before the GEMM, which then loads it at full width: odd pitches otherwise force
    # element-by-element loads, with more instructions and registers than the big tiles can afford
    Knob("repack", bool, False, omitted=False, words={True: "pk"}),
)

# ---- register model -------------------------------------------------------------------------------
# A conservative count of a thread's registers (see `estimated_registers`); fitted with ptxas
# (sm_90, CUDA 13) so that no accepted variant spills. NOTES.md has how each figure was found.
REGISTER_OVERHEAD = 28  # pointers, indices, loop counters, bounds (fitted on 321 variants, + 4)
REGISTER_OVERHEAD_CP_ASYNC = 60  # the ring keeps every stage's shared and global addresses live
REGISTERS_PER_LOAD_PASS = 1  # each global load pass keeps an address and a predicate
GUARDED_PASSES_FREE = 32  # guarded single-buffered passes that cost nothing extra (72 spilled)
REGISTERS_SWIZZLED_B = 12  # swizzled transposed B keeps an address per fragment load (110 variants)
REGISTERS_SWIZZLED_A_STAGED = 8  # swizzled transposed A staged in registers in > 2 chunks (96 variants)
REGISTERS_STREAM_K = 4  # the stream-K loop's iteration range and tile bookkeeping (190 variants)
REGISTERS_STREAM_K_TIGHT = 12  # the same where the estimate has less slack (swizzle, stages < 3, TN)
REGISTERS_SPLIT_IN_KERNEL = 4  # a fused or cluster split's addresses and rank, live next to the accumulators
# how far under the estimate an explicit max_registers may go (8: none of 24 spilled; 16-24: one);
# a kernel that spills under its cap is refused when loaded
MAX_REGISTERS_SLACK = 24

# Built-in configurations by problem size for problems nothing was tuned for (dispatch tries them in
# order until one passes check): big tiles for large outputs, small ones for small outputs.
DEFAULTS = (
    # stream-K: 0.989x cuBLAS at 4096^3 on an H100 where the same tiles in a plain grid made 0.968x
    ("large", "128x256x16_w64x64_t8x16_v44_s3_pad_g8_k1_o1_r_sk"),
    ("large", "128x256x16_w64x64_t8x16_v44_s3_pad_g8_k1_o1_r"),
    ("large", "32x256x16_w16x256_t8x16_v44_s3_pad_g16_k1_o3"),
    ("large", "64x128x16_w32x64_t8x8_v44_s3_swizzle_g8_k1_o1"),
    ("medium", "64x64x16_w32x32_t4x8_v44_s3_pad_g8_k1_o2"),
    ("small", "32x32x16_w16x32_t2x8_v42_s3_pad_g8_k1_o4"),
    ("small", "16x32x8_w16x16_t2x4_v12_s2_plain_g1_k1_o4"),
)


def transposed_stores(problem: Problem) -> tuple[bool, bool]:
    """Whether A's and B's global-to-shared copy transposes: shared memory holds both K-major, so an
    operand whose contiguous dimension is K (A stored M x K, B stored N x K) is transposed on the way."""
    return (not problem.trans_a, problem.trans_b)


class SimtConfig(VectorizedLoads, GemmConfig):
    """A configuration of the SIMT family (FP32 on CUDA cores): block, warp and thread tiles, vector
    widths, pipeline stages, shared-memory layout, block swizzle, split-K and stream-K. `name` is its
    short form (as records name it), `check(problem, device)` the reasons it cannot run there."""

    family = "simt"
    family_applies_epilogue = True  # (in its store, from the accumulators: templates/common.cuh.j2)
    label = "SIMT"
    knobs = KNOBS
    if TYPE_CHECKING:  # the knobs' fields as type checkers see them: knobs.knob_fields(KNOBS), checked by tests
        bm: int = 128
        bn: int = 128
        bk: int = 8
        wm: int = 32
        wn: int = 64
        tm: int = 8
        tn: int = 8
        vec: int = 4
        vec_frag: int = 4
        stages: int = 2
        smem: str = 'pad'
        group_m: int = 8
        split_k: int = 1
        min_blocks: int = 1
        transpose: str = 'async'
        stream_k: bool = False
        max_registers: int = 0
        split_reduce: str = 'kernel'
        repack: bool = False
    template = "simt_gemm.cu.j2"
    widths_allowed: ClassVar[tuple[int, ...]] = VECTOR_WIDTHS
    vectorized_c = True
    space_constants: ClassVar[dict[str, Any]] = {"WARP": WARP, "FIRST_ASYNC_STAGE": FIRST_ASYNC_STAGE, "REGISTERS_PER_BLOCK": REGISTERS_PER_BLOCK,
                       "MAX_REGISTERS_PER_THREAD": MAX_REGISTERS_PER_THREAD, "REGISTER_GRANULE": REGISTER_GRANULE}

    @classmethod
    def defaults(cls, problem: Problem) -> tuple[tuple[str, str], ...]:
        return DEFAULTS

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn) * WARP

    @property
    def launch_kind(self) -> LaunchKind:
        if self.stream_k:
            return LaunchKind.STREAM_K
        if self.split_k > 1 and self.split_reduce == "fused":
            return LaunchKind.SPLIT_K_FUSED
        return LaunchKind.SPLIT_K_CLUSTER if self.cluster_reduce else LaunchKind.TILES

    @property
    def cluster_reduce(self) -> bool:
        """Whether the K splits of a tile add up inside a thread-block cluster (no second kernel)."""
        return self.split_reduce == "cluster" and self.split_k > 1

    def reduce_kernel(self, kernel: str) -> str | None:
        return super().reduce_kernel(kernel) if self.split_reduce == "kernel" else None

    @property
    def repacks_operands(self) -> bool:
        return self.repack is True

    @property
    def register_cap(self) -> int:
        return self.max_registers

    @property
    def smem_buffers(self) -> int:
        return max(1, self.stages)

    def smem_pad(self, problem: Problem) -> tuple[int, int]:
        """Padding (floats) of the A and B shared-memory rows; only transposed stores are padded."""
        pad = SMEM_PAD_FLOATS if self.smem == "pad" else 0
        a_transposed, b_transposed = transposed_stores(problem)
        return (pad if a_transposed else 0, pad if b_transposed else 0)

    def smem_bytes(self, problem: Problem) -> int:
        """Dynamic shared memory of the kernel: the pipeline's buffers of both operands (and, for a
        split-K cluster, room for the block's partial sums after the main loop)."""
        pad_a, pad_b = self.smem_pad(problem)
        pipeline = 4 * self.smem_buffers * self.bk * (self.bm + pad_a + self.bn + pad_b)
        return max(pipeline, 4 * self.bm * self.bn) if self.cluster_reduce else pipeline

    def registers_staged(self, problem: Problem) -> tuple[bool, bool]:
        """Whether A's and B's slices pass through registers in the cp.async pipeline."""
        via_registers = self.stages >= FIRST_ASYNC_STAGE and self.transpose == "registers"
        a_transposed, b_transposed = transposed_stores(problem)
        return (via_registers and a_transposed, via_registers and b_transposed)

    def load_passes(self, problem: Problem) -> int:
        """Global vector loads per thread per K slice, A and B together, at the packed widths."""
        widths = self.packed_widths(problem)
        return (self.bm * self.bk // widths.a + self.bn * self.bk // widths.b) // self.threads

    def estimated_registers(self, problem: Problem) -> int:
        """A conservative count of the registers a thread needs."""
        ring = self.stages >= FIRST_ASYNC_STAGE
        accumulators = self.tm * self.tn
        # fragments of A and B, double-buffered from stage 2 (the ring single-buffers A's, but ptxas
        # renames registers to hoist its loads: they count twice all the same)
        fragments = (self.tm + self.tn) * (2 if self.stages >= 2 else 1)
        # cp.async moves tiles without registers; otherwise a whole tile slice is staged in them
        if not ring:
            staged = (self.bm + self.bn) * self.bk // self.threads
        else:
            staged = sum(extent * self.bk // self.threads
                         for extent, through_registers in zip((self.bm, self.bn), self.registers_staged(problem))
                         if through_registers)
        overhead = REGISTER_OVERHEAD_CP_ASYNC if ring else REGISTER_OVERHEAD
        if ring and self.smem == "swizzle":
            a_transposed, b_transposed = transposed_stores(problem)
            if b_transposed:
                # swizzled, each of B's fragment loads keeps its own address: more, the narrower they are
                overhead += REGISTERS_SWIZZLED_B + 2 * max(0, self.tn // self.vec_frag - 4)
            if a_transposed:
                overhead += 2 * max(0, self.tm // self.vec_frag - 2)
                if self.registers_staged(problem)[0] and self.tm // self.vec_frag > 2:
                    overhead += REGISTERS_SWIZZLED_A_STAGED
        if self.split_k > 1 and self.split_reduce != "kernel":
            overhead += REGISTERS_SPLIT_IN_KERNEL
        if self.stream_k:
            overhead += REGISTERS_STREAM_K
            if self.smem == "swizzle" or not ring or not any(transposed_stores(problem)):
                overhead += REGISTERS_STREAM_K_TIGHT
        passes = self.load_passes(problem)
        if not ring and (problem.m % self.bm or problem.n % self.bn or problem.k % self.bk):
            # guarded loads keep their bounds tests live: across the whole slice with a register
            # double buffer; with a single buffer, past a few dozen of them
            overhead += passes if self.stages == 2 else max(0, passes - GUARDED_PASSES_FREE)
        return accumulators + fragments + staged + passes * REGISTERS_PER_LOAD_PASS + overhead

    # ---- validity ------------------------------------------------------------------------------
    def check(self, problem: Problem, device: Device) -> list[str]:
        """Every reason this configuration cannot run `problem` on `device` (empty: it can)."""
        reasons, bad = self.reason_collector()
        reasons += self.dtype_reasons(problem)
        reasons += self.knob_reasons()
        if self.transpose == "registers" and self.stages < FIRST_ASYNC_STAGE:
            bad("choice", f"transpose='registers' needs the cp.async pipeline (stages >= {FIRST_ASYNC_STAGE}), "
                          f"not stages={self.stages}")
        if self.stream_k is True and self.split_k > 1:
            bad("choice", f"stream_k splits K by itself; it excludes split_k={self.split_k}")
        if self.repack is True and self.vec == 1:
            bad("choice", "repack copies operands to vector-aligned pitches; with vec=1 it would copy for nothing")
        if self.split_reduce == "cluster" and isinstance(self.split_k, int) and isinstance(self.tm, int):
            if self.split_k > MAX_CLUSTER:  # (split_k = 1: nothing to add up, a plain kernel)
                bad("choice", f"split_reduce='cluster' adds up at most {MAX_CLUSTER} splits (a portable cluster), "
                              f"not split_k={self.split_k}")
            elif self.tm % self.split_k:
                bad("choice", f"split_reduce='cluster' shares the writing of each thread tile's {self.tm} rows "
                              f"among split_k={self.split_k} blocks: tm must be a multiple of split_k")
            if self.split_k > 1 and device.compute_capability < CLUSTER_CAPABILITY:
                bad("cluster", f"split_reduce='cluster' needs thread-block clusters (compute capability 9.0), "
                               f"device is {device.arch}")
        if reasons:
            return reasons  # the arithmetic below assumes well-formed knobs
        if self.vec > self.bk or self.bm % self.vec or self.bn % self.vec:
            bad("tile-load", f"tile {self.bm}x{self.bn}x{self.bk} is not a multiple of vector width {self.vec}")
            return reasons
        if self.bm % self.wm or self.bn % self.wn:
            bad("warp-tile", f"block tile {self.bm}x{self.bn} is not a multiple of warp tile {self.wm}x{self.wn}")
            return reasons
        if self.wm % self.tm or self.wn % self.tn:
            bad("thread-tile", f"warp tile {self.wm}x{self.wn} is not a multiple of thread tile {self.tm}x{self.tn}")
            return reasons
        lanes = (self.wm // self.tm) * (self.wn // self.tn)
        if lanes != WARP:
            bad("warp-lanes", f"warp tile {self.wm}x{self.wn} / thread tile {self.tm}x{self.tn} gives {lanes} "
                              f"lanes, not {WARP}")
        if self.tm % self.vec_frag or self.tn % self.vec_frag:
            bad("frag-vector", f"thread tile {self.tm}x{self.tn} is not a multiple of vec_frag={self.vec_frag}")
        threads = self.threads
        if threads > device.max_threads_per_block:
            bad("threads", f"{threads} threads per block exceed the device limit {device.max_threads_per_block}")
        for operand, extent in (("A", self.bm), ("B", self.bn)):
            if self.bk % self.vec or extent % self.vec or (extent * self.bk) % (threads * self.vec):
                bad("tile-load", f"{operand} tile {extent}x{self.bk} does not split into {threads} threads "
                                 f"loading {self.vec}-wide vectors")
        in_kernel_flag = self.launch_kind in (LaunchKind.STREAM_K, LaunchKind.SPLIT_K_FUSED)
        smem = self.smem_bytes(problem) + (STREAM_K_STATIC_SMEM if in_kernel_flag else 0)
        if smem > device.smem_per_block_optin:
            bad("shared-memory", f"{smem} bytes of shared memory exceed the device limit {device.smem_per_block_optin}")
        regs, limit = self.estimated_registers(problem), self.register_limit(device)
        if self.max_registers > limit:
            bad("registers", f"max_registers={self.max_registers} exceeds the {limit} registers per thread that "
                             f"{self.min_blocks} block(s) of {threads} threads per SM leave")
        elif self.max_registers and regs > self.max_registers + MAX_REGISTERS_SLACK:
            bad("registers", f"about {regs} registers per thread (accumulators {self.tm}x{self.tn}) are more than "
                             f"{MAX_REGISTERS_SLACK} over max_registers={self.max_registers}")
        elif not self.max_registers and regs > limit:
            bad("registers", f"about {regs} registers per thread (accumulators {self.tm}x{self.tn}) exceed "
                             f"the {limit} available to {threads} threads")
        self.launch_reasons(problem, device, smem, bad, cp_async=self.stages >= FIRST_ASYNC_STAGE)
        return reasons

    # ---- vector widths -------------------------------------------------------------------------
    def c_width(self, aligned: Any) -> int:
        # split-K writes partial products to an aligned workspace; the reduction is scalar (where
        # the splits add up in the kernel, it writes C itself)
        return self.vec if self.split_k > 1 and self.split_reduce == "kernel" else aligned()

    # ---- rendering -----------------------------------------------------------------------------
    def kernel_name(self, problem: Problem, widths: VectorWidths) -> str:
        return f"ag_{self.family}_{self.name}_{problem.layout}_e{self.even(problem)}_v{widths}"

    def context(self, problem: Problem, widths: VectorWidths) -> dict[str, Any]:
        """What simt_gemm.cu.j2 needs besides the kernel's name."""
        pad_a, pad_b = self.smem_pad(problem)
        a_transposed, b_transposed = transposed_stores(problem)
        staged_a, staged_b = self.registers_staged(problem)
        row = dtypes.lookup(problem.dtype, problem.compute)
        return dict(
            to_acc=row.to_acc, from_acc=row.from_acc, smem_bytes=self.smem_bytes(problem),
            layout=problem.layout.upper(), trans_a=problem.trans_a, trans_b=problem.trans_b,
            bm=self.bm, bn=self.bn, bk=self.bk, wm=self.wm, wn=self.wn, tm=self.tm, tn=self.tn,
            vec_frag=self.vec_frag, va=widths.a, vb=widths.b, vc=widths.c,
            stages=self.stages, buffers=self.smem_buffers, use_cp_async=self.stages >= FIRST_ASYNC_STAGE,
            group_m=self.group_m, split_k=self.split_k, stream_k=self.stream_k, cluster_reduce=self.cluster_reduce,
            fused_split=self.launch_kind == LaunchKind.SPLIT_K_FUSED,
            max_registers=self.max_registers, min_blocks=self.min_blocks,
            **self.even_flags(problem), pad_a=pad_a, pad_b=pad_b,
            swizzle_a=cxx_bool(self.smem == "swizzle" and a_transposed),
            swizzle_b=cxx_bool(self.smem == "swizzle" and b_transposed),
            staged_a=staged_a, staged_b=staged_b, repack=self.repacks_operands,
        )
