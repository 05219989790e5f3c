"""Kernel configurations: one frozen dataclass per template family, with a procedural name and
`check(problem, device)`, the list of every reason the configuration cannot run that problem.

A configuration that passes `check` must render, compile without register spills and compute the
right answer; the tests hold `check` to that promise.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .problem import Device, Problem

# Every reason `check` can give starts with one of these codes (tests produce each one).
REASON_CODES = (
    "dtype",  # the family cannot compute this dtype / compute mode
    "choice",  # a knob has a value outside the family's vocabulary
    "warp-tile",  # block tile not a multiple of the warp tile
    "thread-tile",  # warp tile not a multiple of the thread tile
    "warp-lanes",  # the thread tiles of a warp do not make 32 lanes
    "frag-vector",  # thread tile not a multiple of the shared-memory fragment vector width
    "threads",  # more threads per block than the device allows
    "tile-load",  # a tile does not split evenly into the block's vector loads
    "shared-memory",  # more shared memory than the device grants one block
    "registers",  # the thread's register arrays would not fit without spilling
    "occupancy",  # min_blocks blocks cannot share one SM (threads, shared memory)
    "cp-async",  # multi-stage pipelines need cp.async (compute capability 8.0)
    "split-k",  # more K splits than K tiles
    "grid",  # the launch grid exceeds the device's grid limits
    "size",  # a dimension exceeds 32-bit indexing
    "fragment",  # a tile is not a multiple of the tensor-core fragment shape
    "tensor-core",  # the device has no tensor-core instruction for this type
    "layout",  # the instruction cannot read the operands in this layout
)

SMEM_LAYOUTS = ("plain", "pad", "swizzle")
TRANSPOSE_PATHS = ("async", "registers")
VECTOR_WIDTHS = (1, 2, 4)
SMEM_PAD_FLOATS = 4  # one 16-byte vector: keeps LDS.128 aligned and shifts each row by 4 banks
INT32_MAX = 2**31 - 1
GRID_Y_MAX = 65535


def _pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


class _Knobs:
    """What every config family shares: its dict form, copies with changes, the register cap its
    `min_blocks` implies, and the launch limits every kernel of the project obeys."""

    family = ""
    _label = ""  # how messages name the family

    def to_dict(self) -> dict:
        return {"family": self.family, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict):
        data = dict(data)
        family = data.pop("family", cls.family)
        if family != cls.family:
            raise ValueError(f"config family {family!r} is not {cls.family!r}")
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown {cls._label} config knobs: {', '.join(sorted(unknown))}")
        return cls(**data)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def register_limit(self, device: Device) -> int:
        per_thread = device.regs_per_block // max(self.threads * self.min_blocks, 1)
        return min(255, per_thread - per_thread % 8)

    def _launch_reasons(self, problem: Problem, device: Device, smem: int, first_async_stage: int, bad) -> None:
        """Occupancy, cp.async, split-K, grid and index-width limits, reported through `bad`."""
        threads = self.threads
        if self.min_blocks > 1:
            if threads * self.min_blocks > device.max_threads_per_sm:
                bad("occupancy", f"{self.min_blocks} blocks of {threads} threads exceed the "
                                 f"{device.max_threads_per_sm} threads of an SM")
            if (smem + 1024) * self.min_blocks > device.smem_per_sm:
                bad("occupancy", f"{self.min_blocks} blocks of {smem} bytes exceed the "
                                 f"{device.smem_per_sm} bytes of shared memory of an SM")
        if self.stages >= first_async_stage and device.compute_capability < (8, 0):
            bad("cp-async", f"{self.stages} stages need cp.async (compute capability 8.0), device is {device.arch}")
        tiles_k = self.tiles_k(problem)
        if self.split_k > tiles_k:
            bad("split-k", f"split_k={self.split_k} exceeds the {tiles_k} K tiles of K={problem.k}")
        if problem.batch * self.split_k > GRID_Y_MAX:
            bad("grid", f"batch {problem.batch} x split_k {self.split_k} exceeds the grid limit {GRID_Y_MAX}")
        tiles = -(-problem.m // self.bm) * -(-problem.n // self.bn)
        if tiles > INT32_MAX:
            bad("grid", f"{tiles} blocks exceed the grid limit {INT32_MAX}")
        if getattr(self, "stream_k", False) and tiles * problem.batch * tiles_k > INT32_MAX:
            bad("size", f"{tiles * problem.batch * tiles_k} stream-K iterations exceed the kernel's 32-bit count")
        if max(problem.m, problem.n, problem.k) > INT32_MAX:
            bad("size", "a dimension exceeds 2^31-1, beyond the kernel's 32-bit indexing")


@dataclass(frozen=True)
class SimtConfig(_Knobs):
    """Knobs of the SIMT (CUDA-core FFMA) GEMM template.

    bm, bn, bk: block tile; wm, wn: warp tile; tm, tn: outputs per thread (the thread tile, made of
    vec_frag-wide chunks spread across the warp tile); vec: width of global loads (elements);
    vec_frag: width of shared-memory fragment loads (4 = LDS.128); stages: 1 single buffer,
    2 double buffer with register prefetch, >= 3 cp.async ring; smem: layout of operands whose
    shared-memory store is a transpose ("plain", "pad" by one 16-byte vector, XOR "swizzle");
    group_m: block-swizzle group height for L2 reuse (1 = row-major rasterization);
    split_k: number of K slices reduced in a second pass (1 = off);
    min_blocks: blocks per SM the compiler must make room for (`__launch_bounds__`): caps the
    registers per thread at regs_per_block / (threads * min_blocks), trading registers for occupancy;
    transpose: how a cp.async pipeline (stages >= 3) brings in an operand whose shared-memory store
    is a transpose: "async" copies it element by element with 4-byte cp.async, "registers" loads
    it with vector loads into registers at the top of a K slice and stores it transposed before the
    slice's closing barrier (the other operand keeps its cp.async ring);
    stream_k: a persistent grid of as many blocks as fit on the device; they take whole tiles
    while a full wave is left, then share the last partial wave's (tile, K slice) iterations in
    equal runs, so that wave leaves no SM idle; blocks that share a tile add up their parts
    through a workspace (no second kernel). Excludes split_k;
    max_registers: 0 lets `__launch_bounds__` cap the registers for min_blocks; otherwise the kernel
    is compiled with `__maxnreg__(max_registers)`, a tighter cap (at most the one min_blocks
    allows), under which ptxas schedules the main loop differently (sometimes much better).
    """

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
    smem: str = "pad"
    group_m: int = 8
    split_k: int = 1
    min_blocks: int = 1
    transpose: str = "async"
    stream_k: bool = False
    max_registers: int = 0

    family = "simt"
    _label = "SIMT"

    # ---- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return (
            f"{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}_t{self.tm}x{self.tn}"
            f"_v{self.vec}{self.vec_frag}_s{self.stages}_{self.smem}_g{self.group_m}_k{self.split_k}_o{self.min_blocks}"
            + ("_r" if self.transpose == "registers" else "")
            + ("_sk" if self.stream_k else "")
            + (f"_reg{self.max_registers}" if self.max_registers else "")
        )

    _NAME_RE = re.compile(
        r"(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)_t(\d+)x(\d+)_v(\d)(\d)_s(\d+)_([a-z]+)_g(\d+)_k(\d+)_o(\d+)(_r)?(_sk)?(?:_reg(\d+))?"
    )

    @classmethod
    def from_name(cls, name: str) -> SimtConfig:
        match = cls._NAME_RE.fullmatch(name)
        if not match:
            raise ValueError(f"not a SIMT config name: {name!r}")
        g = match.groups()
        ints = [int(x) for x in g[:10]]
        return cls(
            *ints,
            smem=g[10],
            group_m=int(g[11]),
            split_k=int(g[12]),
            min_blocks=int(g[13]),
            transpose="registers" if g[14] else "async",
            stream_k=bool(g[15]),
            max_registers=int(g[16] or 0),
        )

    # ---- derived quantities (shared with the template through render.py) -------------------
    @property
    def threads(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn) * 32

    @property
    def smem_buffers(self) -> int:
        return max(1, self.stages)

    def smem_pad(self, problem: Problem) -> tuple[int, int]:
        """Padding (floats) of the A and B shared-memory rows; only transposed stores are padded."""
        pad = SMEM_PAD_FLOATS if self.smem == "pad" else 0
        a_transposed, b_transposed = transposed_stores(problem)
        return (pad if a_transposed else 0, pad if b_transposed else 0)

    def smem_bytes(self, problem: Problem) -> int:
        pad_a, pad_b = self.smem_pad(problem)
        return 4 * self.smem_buffers * self.bk * (self.bm + pad_a + self.bn + pad_b)

    def load_passes(self, problem: Problem) -> int:
        """Global vector loads per thread per K slice, A and B together, at the packed widths."""
        widths = packed_vector_widths(self, problem)
        return (self.bm * self.bk // widths.a + self.bn * self.bk // widths.b) // self.threads

    def estimated_registers(self, problem: Problem) -> int:
        """A conservative count of the registers a thread needs (calibrated against ptxas)."""
        accumulators = self.tm * self.tn
        # fragments of A and B, double-buffered from stage 2 (the cp.async pipeline single-buffers
        # A's, but ptxas renames registers to hoist its loads: count them twice all the same)
        fragments = (self.tm + self.tn) * (2 if self.stages >= 2 else 1)
        # cp.async moves tiles without registers; otherwise a whole tile slice is staged in them.
        if self.stages < 3:
            staged = (self.bm + self.bn) * self.bk // self.threads
        else:
            staged = sum(
                extent * self.bk // self.threads
                for extent, through_registers in zip((self.bm, self.bn), self.registers_staged(problem))
                if through_registers
            )
        overhead = REGISTER_OVERHEAD_CP_ASYNC if self.stages >= 3 else REGISTER_OVERHEAD
        if self.stages >= 3 and self.smem == "swizzle":
            a_transposed, b_transposed = transposed_stores(problem)
            if b_transposed:
                # B's fragment loads are spread over the FFMAs; swizzled, each keeps its own
                # address live: more of them the narrower the chunks
                overhead += REGISTERS_SWIZZLED_B + 2 * max(0, self.tn // self.vec_frag - 4)
            if a_transposed:
                overhead += 2 * max(0, self.tm // self.vec_frag - 2)
                if self.registers_staged(problem)[0] and self.tm // self.vec_frag > 2:
                    overhead += REGISTERS_SWIZZLED_A_STAGED
        if self.stream_k:
            overhead += REGISTERS_STREAM_K
            if self.smem == "swizzle" or self.stages < 3 or not any(transposed_stores(problem)):
                overhead += REGISTERS_STREAM_K_TIGHT
        passes = self.load_passes(problem)
        if self.stages < 3 and (problem.m % self.bm or problem.n % self.bn or problem.k % self.bk):
            # guarded loads keep their bounds tests live: across the whole slice with a register
            # double buffer; with a single buffer, past a few dozen of them
            overhead += passes if self.stages == 2 else max(0, passes - GUARDED_PASSES_FREE)
        return accumulators + fragments + staged + passes * REGISTERS_PER_LOAD_PASS + overhead

    def registers_staged(self, problem: Problem) -> tuple[bool, bool]:
        """Whether A's and B's slices pass through registers in the cp.async pipeline."""
        via_registers = self.stages >= 3 and self.transpose == "registers"
        a_transposed, b_transposed = transposed_stores(problem)
        return (via_registers and a_transposed, via_registers and b_transposed)

    def tiles_k(self, problem: Problem) -> int:
        return -(-problem.k // self.bk)

    # ---- validity ---------------------------------------------------------------------------
    def check(self, problem: Problem, device: Device) -> list[str]:
        reasons: list[str] = []

        def bad(code: str, message: str) -> None:
            reasons.append(f"{code}: {message}")

        if problem.dtype != "float32" or problem.compute != "fp32":
            bad("dtype", f"the SIMT template computes float32/fp32, not {problem.dtype}/{problem.compute}")

        for knob in ("bm", "bn", "bk", "wm", "wn", "tm", "tn"):
            value = getattr(self, knob)
            if not _pow2(value):
                bad("choice", f"{knob}={value} must be a power of two")
        if self.bk < 2:
            bad("choice", f"bk={self.bk} must be at least 2 (fragments are double-buffered per k pair)")
        for knob in ("vec", "vec_frag"):
            if getattr(self, knob) not in VECTOR_WIDTHS:
                bad("choice", f"{knob}={getattr(self, knob)} must be one of {VECTOR_WIDTHS}")
        if self.smem not in SMEM_LAYOUTS:
            bad("choice", f"smem={self.smem!r} must be one of {', '.join(SMEM_LAYOUTS)}")
        if self.transpose not in TRANSPOSE_PATHS:
            bad("choice", f"transpose={self.transpose!r} must be one of {', '.join(TRANSPOSE_PATHS)}")
        elif self.transpose == "registers" and self.stages < 3:
            bad("choice", f"transpose='registers' needs the cp.async pipeline (stages >= 3), not stages={self.stages}")
        for knob in ("stages", "group_m", "split_k", "min_blocks"):
            if getattr(self, knob) < 1:
                bad("choice", f"{knob}={getattr(self, knob)} must be >= 1")
        if self.max_registers and not 16 <= self.max_registers <= 255:
            bad("choice", f"max_registers={self.max_registers} must be 0 (automatic) or 16 to 255")
        if not isinstance(self.stream_k, bool):
            bad("choice", f"stream_k={self.stream_k!r} must be true or false")
        elif self.stream_k and self.split_k > 1:
            bad("choice", f"stream_k splits K by itself; it excludes split_k={self.split_k}")
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
        if lanes != 32:
            bad(
                "warp-lanes",
                f"warp tile {self.wm}x{self.wn} / thread tile {self.tm}x{self.tn} gives {lanes} lanes, not 32",
            )
        if self.tm % self.vec_frag or self.tn % self.vec_frag:
            bad("frag-vector", f"thread tile {self.tm}x{self.tn} is not a multiple of vec_frag={self.vec_frag}")

        threads = self.threads
        if threads > device.max_threads_per_block:
            bad("threads", f"{threads} threads per block exceed the device limit {device.max_threads_per_block}")

        for operand, extent in (("A", self.bm), ("B", self.bn)):
            elements = extent * self.bk
            if self.bk % self.vec or extent % self.vec or elements % (threads * self.vec):
                bad(
                    "tile-load",
                    f"{operand} tile {extent}x{self.bk} does not split into {threads} threads "
                    f"loading {self.vec}-wide vectors",
                )

        smem = self.smem_bytes(problem) + (STREAM_K_STATIC_SMEM if self.stream_k else 0)
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

        self._launch_reasons(problem, device, smem, 3, bad)  # cp.async from 3 stages (2: registers)
        return reasons


# Registers beyond the arrays (pointers, indices, loop counters, bounds), plus one per global load
# pass (its address and predicate). cp.async pipelines keep more addresses live (shared and global
# of every stage in flight). Fitted with ptxas on 321 variants (sm_90, CUDA 13, register caps from
# 40 to 255) so that no accepted variant spilled, plus a margin of 4; re-checked on 110 variants
# near their cap after A's fragment became single-buffered and transposed operands could be staged
# in registers, which showed that swizzled transposed B (layouts NT, TT) needs 12 more.
REGISTER_OVERHEAD = 28
REGISTER_OVERHEAD_CP_ASYNC = 60
REGISTERS_PER_LOAD_PASS = 1
# Register-staged slices (stages 1-2) of a problem with tails: a 128x16x32 tile loading scalars
# in 72 passes spilled 184 bytes at 255 registers, 27 over its estimate, and with two stages a
# 128x64x8 one of 24 passes did too; single-buffered tiles of 16 passes fit.
GUARDED_PASSES_FREE = 32
REGISTERS_SWIZZLED_B = 12
# Swizzled transposed A staged in registers, in more than two fragment chunks (a t16x1 thread
# tile with vec_frag 1 spilled at 128). The swizzle terms were fitted on 96 variants near the cap.
REGISTERS_SWIZZLED_A_STAGED = 8
# The stream-K loop keeps its iteration range (64-bit) and tile bookkeeping live across tiles.
# Checked with ptxas on the seeds and on 190 variants near the register cap. With a swizzled
# layout, register-staged slices (stages 1-2) or in layout TN (no transposed store, whose
# estimate has less slack), variants 8 over their estimate still spilled.
REGISTERS_STREAM_K = 4
# How far below the estimate an explicit max_registers may go. The estimate carries the margin
# that keeps every accepted variant spill-free at the occupancy cap; 8 under it, none of 24
# sampled variants spilled, 16 and 24 under it one in 24 did. A kernel that spills under
# max_registers is refused when it is loaded (launch.prepare), so the tuner records a failure.
MAX_REGISTERS_SLACK = 24
REGISTERS_STREAM_K_TIGHT = 12
STREAM_K_STATIC_SMEM = 16  # the flag that tells a block it finishes a shared tile


@dataclass(frozen=True)
class VectorWidths:
    """Widths (elements) of the global accesses to A, B and C actually compiled into a kernel.

    A configuration's `vec` is the widest it may use; an operand whose pointer or leading dimension
    is not aligned to it gets a narrower kernel variant instead of a failure.
    """

    a: int
    b: int
    c: int

    def __str__(self) -> str:
        return f"{self.a}{self.b}{self.c}"


def widest_vector(limit: int, *multiples_of: int) -> int:
    """The widest of 8, 4, 2, 1 that is <= limit and divides every given number."""
    for width in (8, 4, 2, 1):
        if width <= limit and all(x % width == 0 for x in multiples_of):
            return width
    return 1


def packed_vector_widths(config: SimtConfig, problem: Problem) -> VectorWidths:
    """Vector widths for densely packed operands (leading dimension = row length)."""
    lda = problem.m if problem.trans_a else problem.k
    ldb = problem.k if problem.trans_b else problem.n
    return VectorWidths(
        a=widest_vector(config.vec, lda),
        b=widest_vector(config.vec, ldb),
        # split-K writes its partial products to an aligned workspace; the reduction is scalar
        c=config.vec if config.split_k > 1 else widest_vector(config.vec, problem.n),
    )


def transposed_stores(problem: Problem) -> tuple[bool, bool]:
    """Whether A's and B's global-to-shared copy transposes (their contiguous dimension is K).

    Shared memory holds both operands K-major (As[k][m], Bs[k][n]) so that a thread's fragment of
    consecutive m (or n) is one vector load. A stored M×K (layout n) and B stored N×K (layout t)
    have K contiguous in global memory, so their tiles are transposed on the way in.
    """
    return (not problem.trans_a, problem.trans_b)


def config_from_dict(data: dict):
    """Rebuilds a configuration of any family from its `to_dict()` form."""
    family = data.get("family", "simt")
    if family == "simt":
        return SimtConfig.from_dict(data)
    if family == "wmma":
        return WmmaConfig.from_dict(data)
    raise ValueError(f"unknown config family {family!r}")


def config_from_name(name: str):
    """A configuration of any family from its name (WMMA names start with ``wmma_``)."""
    return WmmaConfig.from_name(name) if name.startswith("wmma_") else SimtConfig.from_name(name)


# ---- tensor cores (nvcuda::wmma) ------------------------------------------------------------------
@dataclass(frozen=True)
class WmmaType:
    """What the WMMA template needs to know about one (dtype, compute) pair."""

    element: str  # C++ element type of A, B and C
    accumulator: str  # C++ type of the accumulator fragments, alpha and beta
    itemsize: int
    accumulator_size: int
    fragment: tuple[int, int, int]  # the m, n, k of one mma
    min_arch: tuple[int, int]
    precision: str  # the fragment's element type for A and B (wmma::precision::tf32 for TF32)
    mma_fragment: tuple[int, int, int]  # the m, n, k of one mma.sync (the `mma` path)
    mma_input: str  # PTX type of A and B in mma.sync
    mma_min_arch: tuple[int, int]
    wgmma_k: int = 0  # K of one wgmma (the `wgmma` path); 0: no wgmma path for this type


WMMA_TYPES = {
    ("float16", "fp32"): WmmaType("__half", "float", 2, 4, (16, 16, 16), (7, 0), "__half",
                                  (16, 8, 16), "f16", (8, 0), wgmma_k=16),
    ("bfloat16", "fp32"): WmmaType("__nv_bfloat16", "float", 2, 4, (16, 16, 16), (8, 0), "__nv_bfloat16",
                                   (16, 8, 16), "bf16", (8, 0), wgmma_k=16),
    ("float32", "tf32"): WmmaType("float", "float", 4, 4, (16, 16, 8), (8, 0), "wmma::precision::tf32",
                                  (16, 8, 8), "tf32", (8, 0), wgmma_k=8),
    # mma.sync m16n8k8 in FP64 is new in sm_90 (sm_80 has only the m8n8k4 that WMMA uses)
    ("float64", "fp64"): WmmaType("double", "double", 8, 8, (8, 8, 4), (8, 0), "double",
                                  (16, 8, 8), "f64", (9, 0)),
}
# Bytes added to every shared-memory row. 16 shifts each row by 4 banks, so that the 8 rows of
# a 16-bit fragment load (16 bytes each) hit 8 bank groups; the wider TF32 and FP64 fragment rows
# need larger shifts for some layouts (ncu: the FP64 kernel with plain rows had 600x cuBLAS's
# shared-memory bank conflicts), so 32 and 64 are searched too.
WMMA_PAD_BYTES = {"plain": 0, "pad": 16, "pad32": 32, "pad64": 64}
WMMA_SMEM_LAYOUTS = tuple(WMMA_PAD_BYTES)
WMMA_REGISTER_OVERHEAD = 66  # fitted with ptxas (sm_90, CUDA 13) so that no accepted variant spills
WMMA_REGISTERS_PER_LOAD = 3
WMMA_REGISTERS_FOR_TAILS = 100  # bounds checks on partial tiles keep many more addresses live
# The mma.sync path (fitted the same way; see WmmaConfig._mma_registers)
MMA_REGISTER_OVERHEAD = 48
MMA_REGISTER_OVERHEAD_TF32 = 56  # the round-to-TF32 conversions need temporaries (more before sm_90)
MMA_TAIL_REGISTERS_16BIT = 60
MMA_TAIL_REGISTERS_PER_PASS = 12
MMA_TAIL_REGISTERS = 10
# The wgmma path (fitted the same way on 42 variants; see WmmaConfig._wgmma_registers)
WGMMA_REGISTER_OVERHEAD = 48
WGMMA_TAIL_REGISTERS = 24
WGMMA_ARCH = (9, 0)  # wgmma exists on sm_90a only: kernels built for it run on compute capability 9.0 alone
WGMMA_SWIZZLE_BYTES = 128  # the shared-memory operand's rows: one 128-byte swizzle row of K


def wgmma_swaps_operands(problem: Problem) -> bool | None:
    """Which operand the wgmma path reads from shared memory, K-major (TF32 allows nothing else;
    the 16-bit types could be transposed there, which the template does not use):
    B when B's K is contiguous (no swap), else A when A's is (the kernel computes C^T = B^T A^T,
    swap), else None: neither operand has K contiguous (layout TN) and the path cannot run."""
    if problem.trans_b:
        return False
    if not problem.trans_a:
        return True
    return None


def wmma_type(problem: Problem) -> WmmaType | None:
    return WMMA_TYPES.get((problem.dtype, problem.compute))


@dataclass(frozen=True)
class WmmaConfig(_Knobs):
    """Knobs of the tensor-core (nvcuda::wmma) GEMM template.

    bm, bn, bk: block tile; wm, wn: warp tile (a grid of mma fragments per warp); vec: elements per
    global load (up to 16 bytes; cp.async copies of 4, 8 or 16 bytes); stages: 1 single buffer,
    2-5 a cp.async ring; smem: "pad", "pad32", "pad64" shift every shared-memory row by 16, 32 or
    64 bytes (conflict-free fragment loads), "plain" does not (WMMA loads fragments from strided
    rows only, so an XOR
    swizzle cannot be expressed; that needs ldmatrix with mma.sync); group_m: block swizzle;
    split_k: K slices reduced in a second pass; min_blocks: blocks per SM for `__launch_bounds__`.
    The operands stay in their global orientation in shared memory (row- or column-major
    fragments), so no layout needs a transposing copy.
    mma: the instructions behind the same tiles and pipeline. False: `nvcuda::wmma` fragments
    (16x16 blocks, FP64 8x8x4), written out through a per-warp staging tile. True: PTX `mma.sync`
    on 16x8 blocks, fragments loaded with `ldmatrix` (16-bit types, and TF32 where K is contiguous
    in shared memory) or element by element, accumulators written straight from registers
    (name suffix `_mma`; FP64 then needs sm_90's m16n8k8).
    wgmma: Hopper's warpgroup `wgmma.mma_async` (TF32, FP16, BF16 on sm_90a; name suffix `_wgmma`,
    its own skeleton): wm x wn is then a warpgroup's tile (4 warps), the operand whose K is
    contiguous is read from 128-byte-swizzled shared memory and the other from registers; 3-5 stages.
    """

    bm: int = 128
    bn: int = 128
    bk: int = 32
    wm: int = 64
    wn: int = 64
    vec: int = 8
    stages: int = 3
    smem: str = "pad"
    group_m: int = 8
    split_k: int = 1
    min_blocks: int = 1
    mma: bool = False
    wgmma: bool = False

    family = "wmma"
    _label = "WMMA"

    @property
    def name(self) -> str:
        return (
            f"wmma_{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}_v{self.vec}_s{self.stages}_{self.smem}"
            f"_g{self.group_m}_k{self.split_k}_o{self.min_blocks}" + ("_mma" if self.mma else "")
            + ("_wgmma" if self.wgmma else "")
        )

    _NAME_RE = re.compile(
        r"wmma_(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)_v(\d+)_s(\d+)_([a-z]+\d*)_g(\d+)_k(\d+)_o(\d+)(_mma)?(_wgmma)?")

    @classmethod
    def from_name(cls, name: str) -> WmmaConfig:
        match = cls._NAME_RE.fullmatch(name)
        if not match:
            raise ValueError(f"not a WMMA config name: {name!r}")
        g = match.groups()
        return cls(*(int(x) for x in g[:7]), smem=g[7], group_m=int(g[8]), split_k=int(g[9]), min_blocks=int(g[10]),
                   mma=bool(g[11]), wgmma=bool(g[12]))

    # ---- derived quantities -------------------------------------------------------------------
    @property
    def threads(self) -> int:
        # the wm x wn tile belongs to a warp, or with wgmma to a warpgroup of 4 warps
        return (self.bm // self.wm) * (self.bn // self.wn) * (128 if self.wgmma else 32)

    def fragment(self, problem: Problem) -> tuple[int, int, int]:
        """The m, n, k of one tensor-core instruction of this config's path (wgmma: in the problem's
        M and N, which the kernel swaps when it computes C^T)."""
        kind = wmma_type(problem)
        if self.wgmma:
            if wgmma_swaps_operands(problem):
                return self.wm, 64, kind.wgmma_k
            return 64, self.wn, kind.wgmma_k
        return kind.mma_fragment if self.mma else kind.fragment

    def _wgmma_tiles(self, problem: Problem) -> tuple[int, int, int, int]:
        """The wgmma path's block and warpgroup extents along P (wgmma's M, fed from registers)
        and Q (its N, read from shared memory): (pb, qb, pw, qw)."""
        if wgmma_swaps_operands(problem):
            return self.bn, self.bm, self.wn, self.wm
        return self.bm, self.bn, self.wm, self.wn

    def smem_pad(self, problem: Problem) -> int:
        """Padding of every shared-memory row, in elements."""
        kind = wmma_type(problem)
        return WMMA_PAD_BYTES.get(self.smem, 0) // kind.itemsize if kind else 0

    def smem_bytes(self, problem: Problem) -> int:
        kind = wmma_type(problem)
        if kind is None:
            return 0
        pad = self.smem_pad(problem)
        if self.wgmma:
            # per stage: P's padded tile in its global orientation, rounded up to the 1 KB that
            # aligns Q's swizzled tile after it; plus 1 KB to align the first stage
            pb, qb, _, _ = self._wgmma_tiles(problem)
            p_trans = (not problem.trans_b) if wgmma_swaps_operands(problem) else problem.trans_a
            p = (self.bk * (pb + pad)) if p_trans else (pb * (self.bk + pad))
            p_bytes = -(-p * kind.itemsize // 1024) * 1024
            return self.stages * (p_bytes + qb * self.bk * kind.itemsize) + 1024
        # each operand tile keeps its global orientation: rows of bk (k contiguous) or of bm/bn
        a = (self.bk * (self.bm + pad)) if problem.trans_a else (self.bm * (self.bk + pad))
        b = (self.bn * (self.bk + pad)) if problem.trans_b else (self.bk * (self.bn + pad))
        pipeline = max(1, self.stages) * (a + b) * kind.itemsize
        if self.mma:
            return pipeline  # accumulators go out straight from registers
        fm, fn, _ = kind.fragment
        epilogue = (self.threads // 32) * fm * fn * kind.accumulator_size  # one fragment per warp
        return max(pipeline, epilogue)

    def tiles_k(self, problem: Problem) -> int:
        return -(-problem.k // self.bk)

    def estimated_registers(self, problem: Problem) -> int:
        """Accumulator and operand fragments of a warp tile, spread over 32 lanes (4-byte registers)."""
        kind = wmma_type(problem)
        if self.wgmma:
            return self._wgmma_registers(problem, kind)
        if self.mma:
            return self._mma_registers(problem, kind)
        _, _, fk = kind.fragment
        accumulators = self.wm * self.wn * kind.accumulator_size // 128
        # ptxas loads the TF32 and FP64 fragments of every k-step of a slice ahead of the mmas,
        # the 16-bit ones a step at a time unless the slice is deep; FP64 needs 40 more
        depth = fk if kind.itemsize == 2 and self.bk <= 2 * fk else self.bk
        fragments = (self.wm + self.wn) * depth * kind.itemsize // 128 + (40 if kind.itemsize == 8 else 0)
        # every global load of a slice keeps a 64-bit address and its bound checks live
        passes = (self.bm + self.bn) * self.bk // max(self.threads * self.vec, 1)
        tails = any(extent % tile for extent, tile in ((problem.m, self.bm), (problem.n, self.bn), (problem.k, self.bk)))
        return (accumulators + fragments + WMMA_REGISTERS_PER_LOAD * passes + WMMA_REGISTER_OVERHEAD
                + (WMMA_REGISTERS_FOR_TAILS if tails else 0))

    def _mma_registers(self, problem: Problem, kind: WmmaType) -> int:
        """The mma.sync path: accumulators, two k-steps of fragments (the register double buffer),
        addresses and loop state. Fitted with ptxas (sm_90, CUDA 13) on ~80 variants so that no
        accepted one spills; tails cost the 16-bit kernels far more than the others (bounds on
        every 8-element copy of every pass)."""
        words = kind.itemsize // 4 or 1  # 32-bit registers per fragment element (FP64: 2)
        accumulators = self.wm * self.wn * kind.accumulator_size // 128
        fragments = 2 * (self.wm // 16 * 4 + self.wn // 8 * 2) * words
        passes = (self.bm + self.bn) * self.bk // max(self.threads * self.vec, 1)
        overhead = MMA_REGISTER_OVERHEAD_TF32 if problem.compute == "tf32" else MMA_REGISTER_OVERHEAD
        tails = any(extent % tile for extent, tile in ((problem.m, self.bm), (problem.n, self.bn), (problem.k, self.bk)))
        tail_cost = (MMA_TAIL_REGISTERS_16BIT + MMA_TAIL_REGISTERS_PER_PASS * passes) if kind.itemsize == 2 \
            else MMA_TAIL_REGISTERS
        return accumulators + fragments + overhead + passes // 2 + (tail_cost if tails else 0)

    def _wgmma_registers(self, problem: Problem, kind: WmmaType) -> int:
        """The wgmma path: each warpgroup's accumulators (pw/64 blocks of qw/2 per thread), P's
        fragments of a whole slice twice (the wgmmas of one slice read them while the next
        slice's are loaded), addresses and loop state. Fitted with ptxas (sm_90a, CUDA 13) on 42
        variants (9 tiles, 3 layouts, with and without tails): none spills; it overestimates
        four-block warpgroup tiles (ptxas does not keep both fragment buffers whole there)."""
        _, _, pw, qw = self._wgmma_tiles(problem)
        blocks = pw // 64
        accumulators = blocks * qw // 2
        fragments = 2 * blocks * (self.bk // kind.wgmma_k) * 4
        tails = any(extent % tile for extent, tile in ((problem.m, self.bm), (problem.n, self.bn), (problem.k, self.bk)))
        return accumulators + fragments + WGMMA_REGISTER_OVERHEAD + (WGMMA_TAIL_REGISTERS if tails else 0)

    def _wgmma_reasons(self, problem: Problem, device: Device, kind: WmmaType, bad) -> None:
        """What only the wgmma path asks: the type, the architecture, the layout and its tiles."""
        if self.mma:
            bad("choice", "mma and wgmma are two different instruction paths; pick one")
        if not kind.wgmma_k:
            bad("tensor-core", f"the wgmma path computes float32/tf32, float16 and bfloat16, "
                               f"not {problem.dtype}/{problem.compute}")
            return
        if device.compute_capability != WGMMA_ARCH:
            bad("tensor-core", f"wgmma needs compute capability {WGMMA_ARCH[0]}.{WGMMA_ARCH[1]} "
                               f"(sm_90a), device is {device.arch}")
        swap = wgmma_swaps_operands(problem)
        if swap is None:
            bad("layout", f"wgmma reads {problem.dtype} from shared memory K-major only: layout "
                          f"{problem.layout.upper()} has K contiguous in neither A nor B")
            return
        if not 3 <= self.stages <= 5:
            bad("choice", f"stages={self.stages}: the wgmma ring needs 3 to 5 stages")
        _, _, pw, qw = self._wgmma_tiles(problem)
        p_dim, q_dim = ("wn", "wm") if swap else ("wm", "wn")
        atom = WGMMA_SWIZZLE_BYTES // kind.itemsize
        if pw % 64 or qw % 8 or qw > 256 or self.bk % atom:
            bad("fragment", f"{p_dim}={pw} must be a multiple of 64 (wgmma rows), {q_dim}={qw} a multiple "
                            f"of 8 up to 256 (wgmma's N) and bk={self.bk} a multiple of {atom} (one "
                            f"{WGMMA_SWIZZLE_BYTES}-byte swizzled row) for layout {problem.layout.upper()}")

    # ---- validity ---------------------------------------------------------------------------
    def check(self, problem: Problem, device: Device) -> list[str]:
        reasons: list[str] = []

        def bad(code: str, message: str) -> None:
            reasons.append(f"{code}: {message}")

        kind = wmma_type(problem)
        if kind is None:
            bad("dtype", f"the WMMA template computes float16/fp32, bfloat16/fp32, float32/tf32 and "
                         f"float64/fp64, not {problem.dtype}/{problem.compute}")
            return reasons
        min_arch = kind.mma_min_arch if self.mma else kind.min_arch
        if self.wgmma:
            self._wgmma_reasons(problem, device, kind, bad)
        elif device.compute_capability < min_arch:
            path = "mma.sync" if self.mma else "WMMA"
            bad("tensor-core", f"{problem.dtype}/{problem.compute} {path} needs compute capability "
                               f"{min_arch[0]}.{min_arch[1]}, device is {device.arch}")
        for knob in ("bm", "bn", "bk", "wm", "wn", "vec"):
            value = getattr(self, knob)
            if not _pow2(value):
                bad("choice", f"{knob}={value} must be a power of two")
        if self.smem not in WMMA_SMEM_LAYOUTS:
            bad("choice", f"smem={self.smem!r} must be one of {', '.join(WMMA_SMEM_LAYOUTS)}")
        if not 1 <= self.stages <= 5:
            bad("choice", f"stages={self.stages} must be 1 to 5")
        for knob in ("group_m", "split_k", "min_blocks"):
            if getattr(self, knob) < 1:
                bad("choice", f"{knob}={getattr(self, knob)} must be >= 1")
        if _pow2(self.vec) and self.vec * kind.itemsize > 16:
            bad("choice", f"vec={self.vec} elements of {kind.itemsize} bytes exceed a 16-byte load")
        if reasons:
            return reasons

        fm, fn, fk = self.fragment(problem)
        # the mma path loads B fragments of two adjacent 8-column blocks at once
        wn_multiple = 2 * fn if self.mma else fn
        # (the wgmma path's shapes were checked with its other reasons)
        if not self.wgmma and (self.wm % fm or self.wn % wn_multiple or self.bk % fk):
            bad("fragment", f"warp tile {self.wm}x{self.wn} and bk={self.bk} must be multiples of "
                            f"{fm}x{wn_multiple}x{fk} for the {fm}x{fn}x{fk} {problem.dtype} "
                            f"{'mma.sync' if self.mma else 'WMMA'} fragment")
            return reasons
        if self.bm % self.wm or self.bn % self.wn:
            bad("warp-tile", f"block tile {self.bm}x{self.bn} is not a multiple of warp tile {self.wm}x{self.wn}")
            return reasons
        threads = self.threads
        if threads > device.max_threads_per_block:
            bad("threads", f"{threads} threads per block exceed the device limit {device.max_threads_per_block}")
        for operand, extent in (("A", self.bm), ("B", self.bn)):
            if extent % self.vec or self.bk % self.vec or (extent * self.bk) % (threads * self.vec):
                bad("tile-load", f"{operand} tile {extent}x{self.bk} does not split into {threads} threads "
                                 f"loading {self.vec}-wide vectors")
        smem = self.smem_bytes(problem)
        if smem > device.smem_per_block_optin:
            bad("shared-memory", f"{smem} bytes of shared memory exceed the device limit {device.smem_per_block_optin}")
        regs, limit = self.estimated_registers(problem), self.register_limit(device)
        if regs > limit:
            bad("registers", f"about {regs} registers per thread (warp tile {self.wm}x{self.wn}) exceed "
                             f"the {limit} available to {threads} threads")
        self._launch_reasons(problem, device, smem, 2, bad)  # every pipelined stage count uses cp.async
        return reasons


def wmma_vector_widths(config: WmmaConfig, problem: Problem) -> VectorWidths:
    """Vector widths (elements) for densely packed operands of a WMMA kernel."""
    lda = problem.m if problem.trans_a else problem.k
    ldb = problem.k if problem.trans_b else problem.n
    return VectorWidths(a=widest_vector(config.vec, lda), b=widest_vector(config.vec, ldb), c=1)
