"""What every tiled GEMM family shares: a block tile BM x BN walking K in BK slices, a batch and
split-K on the grid's second axis, the launch limits every kernel obeys, and the vector widths an
operand's alignment allows. A family subclasses `GemmConfig` with a knob table (bm, bn, bk,
split_k and min_blocks at least) and fills in what differs: `threads`, `check`, `template` and
`context`; where it vectorizes or uses shared memory, also `smem_bytes` and the width rules.

Every kernel takes the same arguments: A, B, C, M, N, K, lda, ldb, ldc, the three batch strides,
alpha, beta, and the K tiles per split; its grid is (output tiles, batch x split_k).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .. import dtypes
from ..problem import Device, Problem
from .knobs import Config, Knob
from .launch_kind import LaunchKind

WARP = 32  # threads of a warp
INT32_MAX = 2**31 - 1  # the kernels index M, N, K and tile counts with 32-bit ints
GRID_Y_MAX = 65535  # the grid's second axis (batch x split_k), a CUDA limit
MAX_REGISTERS_PER_THREAD = 255  # what ptxas can give one thread, on every architecture since sm_30
REGISTER_GRANULE = 8  # registers are allocated per thread in multiples of 8
# a block's shared memory is reserved with this much more for the driver (sm_80 and later)
SMEM_RESERVED_PER_BLOCK = 1024
# The ranges of the knobs every tiled family has: a tile side beyond the 1024 threads a block may
# have, or a K slice beyond 256, fits no device's shared memory and registers; more resident blocks
# per SM than 32 exist on no architecture; GROUP_M beyond 1024 tile rows groups nothing more.
MAX_TILE = 1024
MAX_BK = 256
MAX_GROUP_M = 1024
MAX_BLOCKS_PER_SM = 32


def tile_knobs(bm: int, bn: int, bk: int, wm: int, wn: int, **bk_rules: Any) -> tuple[Knob, ...]:
    """The block tile BM x BN x BK and the warp tile WM x WN every tiled family has (powers of two),
    with the family's defaults; a name starts "BMxBNxBK_wWMxWN"."""
    side = dict(power_of_two=True, low=1, high=MAX_TILE)
    return (Knob("bm", int, bm, join="", **side),
            Knob("bn", int, bn, join="x", **side),
            Knob("bk", int, bk, join="x", power_of_two=True, **{"low": 1, "high": MAX_BK, **bk_rules}),
            Knob("wm", int, wm, code="w", **side),
            Knob("wn", int, wn, join="x", **side))


def grid_knobs() -> tuple[Knob, ...]:
    """The grid knobs every tiled family has: the block-swizzle group height for L2 reuse (1: tiles
    in row-major order), K split over blocks and reduced in a second pass (1: off), and the blocks
    per SM the registers must leave room for (__launch_bounds__); written "_gG_kK_oO"."""
    return (Knob("group_m", int, 8, code="g", low=1, high=MAX_GROUP_M),
            Knob("split_k", int, 1, code="k", low=1, high=GRID_Y_MAX),
            Knob("min_blocks", int, 1, code="o", low=1, high=MAX_BLOCKS_PER_SM))


def swap_knob() -> Knob:
    """The operand-role swap of the families that have one: the kernel computes C^T = B^T A^T (B in
    A's role) and writes C transposed; written "_sw"."""
    return Knob("swap", bool, False, omitted=False, words={True: "sw"})


@dataclass(frozen=True)
class VectorWidths:
    """Widths (elements) of the global accesses to A, B and C compiled into a kernel. A config's
    `vec` is the widest it may use; an operand whose pointer or leading dimension is not aligned to
    it gets a narrower variant of the kernel instead of a failure."""

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


def cxx_bool(value: bool) -> str:
    """A truth value as the kernels' C++ spells it."""
    return "true" if value else "false"


def packed_leading_dimensions(problem: Problem) -> tuple[int, int]:
    """Row pitches of A and B stored densely (a row is as long as the stored matrix is wide)."""
    return (problem.m if problem.trans_a else problem.k, problem.k if problem.trans_b else problem.n)


class GemmConfig(Config):
    """A tiled GEMM configuration. Subclasses provide `threads`, `check`, `template` and `context`."""

    template: ClassVar[str] = ""  # the kernel skeleton in templates/ (a property where it varies)
    arch_suffix: ClassVar[str] = ""  # "a" for kernels that use architecture-specific instructions
    # how the kernel is launched (a property where the knobs decide it)
    launch_kind: ClassVar[LaunchKind] = LaunchKind.TILES
    register_cap: ClassVar[int] = 0  # an explicit register cap per thread (0: from min_blocks)
    takes_grouped: ClassVar[bool] = False  # whether the family renders grouped products (Problem.grouped)
    # whether a new study of the family's spaces starts from the tiles that fill the GPU best
    # (tuning/wave_seeds.py): a compute-bound tile family whose work units are its tiles x K splits
    seeds_by_waves: ClassVar[bool] = False
    # named constants the family's search-space expressions may use (facts of the hardware and pipeline)
    space_constants: ClassVar[dict[str, Any]] = {}
    template_dir: ClassVar[str | None] = None  # where a family from outside the package keeps its templates
    # the family's one shipped search space, for every row it computes (empty: the dtype's own, the
    # `space` column of dtypes, for the rows whose `family` this is)
    search_space: ClassVar[str] = ""
    # where the family's space stands among a tune's candidates (`candidate_for`): the dtype's own
    # family's at 0, those searched before it below 0, those after it above (ties: registry order)
    candidate_order: ClassVar[int] = 0

    @classmethod
    def computes(cls) -> tuple[dtypes.DType, ...]:
        """The (dtype, compute) rows this family computes: by default those `dtypes` assigns to it
        (its `family` or `other_families` column)."""
        return tuple(row for row in dtypes.ROWS if cls.family == row.family or cls.family in row.other_families)

    @classmethod
    def candidate_for(cls, problem: Problem, device: Device | None = None) -> bool:
        """Whether a tune without --space searches this family's space (`space_for`) for `problem`
        on `device` (None: on whatever device it runs): by default where the family is the dtype's
        own (the `family` column of dtypes)."""
        return dtypes.lookup(problem.dtype, problem.compute).family == cls.family

    @classmethod
    def supersedes(cls, problem: Problem, device: Device | None = None) -> tuple[str, ...]:
        """The families whose spaces a tune need not search for `problem` on `device` where this one is
        a candidate (its kernels are of the same types and do better on that architecture): none by
        default."""
        return ()

    @classmethod
    def space_for(cls, problem: Problem) -> str:
        """The shipped search space of this family for `problem`'s dtype and compute mode."""
        return cls.search_space or dtypes.lookup(problem.dtype, problem.compute).space

    @classmethod
    def compute_for(cls, dtype: str) -> str | None:
        """The compute mode this family uses for a dtype (the tensor-core family on float32: TF32)."""
        return next((row.compute for row in cls.computes() if row.name == dtype), None)

    @classmethod
    def computes_names(cls) -> str:
        """The rows this family computes, for messages: "float16/fp32, ... and float64/fp64"."""
        names = [f"{row.name}/{row.compute}" for row in cls.computes()]
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]

    def dtype_reasons(self, problem: Problem) -> list[str]:
        """The 'dtype' reason of `check` where this family's template does not compute the problem's
        dtype and compute mode, and the 'epilogue' reason where this config's kernel cannot apply the
        problem's epilogue (epilogue_refusal), and the 'grouped' one for a grouped product of a family without
        a grouped kernel; empty where it can do all (every family's `check`
        starts with these, so that no search draws a kernel that cannot compute the problem)."""
        refusal = self.epilogue_refusal(problem.epilogue)
        reasons = [f"epilogue: {refusal}"] if refusal else []
        if problem.grouped and not self.takes_grouped:  # (and the grouped product, where it has no kernel for it)
            reasons.append(f"grouped: the {self.family} family has no grouped kernel (the Hopper family has)")
        if self.compute_for(problem.dtype) == problem.compute:
            return reasons
        return [f"dtype: the {self.label} template computes {self.computes_names()}, not {problem.dtype}/{problem.compute}",
                *reasons]

    def smem_bytes(self, problem: Problem) -> int:
        """Dynamic shared memory of the kernel."""
        return 0

    def packed_widths(self, problem: Problem) -> VectorWidths:
        """Vector widths for densely packed operands (a family that vectorizes says which)."""
        return VectorWidths(1, 1, 1)

    def vector_widths(self, a: Any, b: Any, c: Any, itemsize: int) -> VectorWidths:
        """Vector widths the operands' alignment allows (`operands.KernelOperand`s)."""
        return VectorWidths(1, 1, 1)

    def check_widths(self, widths: VectorWidths) -> None:
        if widths != VectorWidths(1, 1, 1):
            raise ValueError(f"{self.label} kernels access memory element by element, not with widths {widths}")

    def kernel_name(self, problem: Problem, widths: VectorWidths) -> str:
        """The kernel's function name: everything that makes its source differ (render adds the
        epilogue's part)."""
        return (f"ag_{self.name}_{problem.dtype}_{problem.compute}_{problem.layout}_e{self.even(problem)}"
                f"_v{widths}")

    # Whether the family's template applies an epilogue (autogemm.epilogue) in its store, through the
    # macros of common.cuh.j2; a family that does not is never rendered for a problem that has one.
    family_applies_epilogue: ClassVar[bool] = False
    # Whether it writes D in an out_dtype other than the operands' (the tile families write C in T)
    writes_other_dtypes: ClassVar[bool] = False
    # Whether it scales FP8 products (epilogue.SCALES) and writes them in the dtype their epilogue names
    applies_scales: ClassVar[bool] = False

    @property
    def applies_epilogue(self) -> bool:
        """Whether this config's kernel applies an epilogue: its family's template does, and the kernel
        writes D itself (or adds its split-K slots up itself), once per output. A split-K reduced by
        a second kernel and stream-K's fix-up write partial sums, which no epilogue may see."""
        if not self.family_applies_epilogue:
            return False
        kind = self.launch_kind
        return kind in (LaunchKind.SPLIT_K_FUSED, LaunchKind.SPLIT_K_CLUSTER, LaunchKind.TMA) or (
            kind == LaunchKind.TILES and self.split_k == 1)

    def epilogue_refusal(self, epilogue: Any) -> str:
        """Why this config's kernel cannot apply `epilogue` (autogemm.epilogue.Epilogue); "" where it
        can (the identity epilogue always)."""
        if epilogue.is_identity:
            return ""
        if not self.family_applies_epilogue:
            return f"the {self.family} family applies no epilogue"
        if not self.applies_epilogue:
            return f"its kernel writes partial sums ({self.launch_kind}, split-K {self.split_k}), not D"
        if epilogue.gated:
            return f"the {self.family} family applies no gated epilogue"
        if epilogue.scale and not self.applies_scales:
            return f"the {self.family} family does not scale FP8 products"
        if epilogue.out_dtype and not self.writes_other_dtypes and not (epilogue.scale and self.applies_scales):
            return f"the {self.family} family writes D in the operands' dtype, not {epilogue.out_dtype}"
        return ""

    def tiles_k(self, problem: Problem) -> int:
        return -(-problem.k // self.bk)

    def output_tiles(self, problem: Problem) -> int:
        return -(-problem.m // self.bm) * -(-problem.n // self.bn)

    def tiles_per_split(self, problem: Problem) -> int:
        return -(-self.tiles_k(problem) // self.split_k)

    def grid(self, problem: Problem) -> tuple[int, int, int]:
        """The launch grid of the "tiles" kind: output tiles, then batch x K splits."""
        return (self.output_tiles(problem), problem.batch * self.split_k, 1)

    def even(self, problem: Problem) -> str:
        """Which of M, N, K are multiples of the block tile ("1") and so need no bounds checks. A grouped
        product's M never is: each group's rows end at an offset the kernel reads on the GPU."""
        return "".join("1" if extent % tile == 0 and not (dim == "m" and problem.grouped) else "0"
                       for dim, extent, tile in (("m", problem.m, self.bm), ("n", problem.n, self.bn),
                                                 ("k", problem.k, self.bk)))

    def even_flags(self, problem: Problem) -> dict[str, Any]:
        """EVEN_M, EVEN_N, EVEN_K as the skeletons take them (`even_m="true"`, ...)."""
        return {f"even_{dim}": cxx_bool(flag == "1") for dim, flag in zip("mnk", self.even(problem))}

    def reduce_kernel(self, kernel: str) -> str | None:
        """The split-K reduction kernel that comes with `kernel`, if any."""
        return f"{kernel}_reduce" if self.split_k > 1 else None

    @property
    def swaps_operands(self) -> bool:
        """Whether the kernel computes C^T = B^T A^T (the short N of a problem on the tile axis that
        suits a short side), writing C transposed; `kernel_problem` is then the swapped problem."""
        return False

    def kernel_problem(self, problem: Problem) -> Problem:
        """The problem the kernel computes for a user's `problem` (its operands' roles swapped
        where `swaps_operands`): what rendering, grids and workspaces are sized for."""
        return problem.swapped() if self.swaps_operands else problem

    @property
    def repacks_operands(self) -> bool:
        """Whether an A or B too misaligned for the config's vector width is first copied to an
        aligned pitch (`repack`), so that the kernel always loads full-width vectors."""
        return False

    def repack_kernel(self, kernel: str) -> str | None:
        """The operand-repacking kernel that comes with `kernel`, if any."""
        return f"{kernel}_repack" if self.repacks_operands else None

    def register_limit(self, device: Device) -> int:
        """Registers per thread that `min_blocks` blocks of this size per SM leave."""
        per_thread = device.regs_per_block // max(self.threads * self.min_blocks, 1)
        return min(MAX_REGISTERS_PER_THREAD, per_thread - per_thread % REGISTER_GRANULE)

    def launch_reasons(self, problem: Problem, device: Device, smem: int, bad: Any, cp_async: bool = False) -> None:
        """Occupancy, cp.async (when the kernel uses it), split-K, grid and index-width limits,
        reported through `bad`."""
        threads = self.threads
        if self.min_blocks > 1:
            if threads * self.min_blocks > device.max_threads_per_sm:
                bad("occupancy", f"{self.min_blocks} blocks of {threads} threads exceed the "
                                 f"{device.max_threads_per_sm} threads of an SM")
            if (smem + SMEM_RESERVED_PER_BLOCK) * self.min_blocks > device.smem_per_sm:
                bad("occupancy", f"{self.min_blocks} blocks of {smem} bytes exceed the "
                                 f"{device.smem_per_sm} bytes of shared memory of an SM")
        if cp_async and device.compute_capability < (8, 0):
            bad("cp-async", f"{self.stages} stages need cp.async (compute capability 8.0), device is {device.arch}")
        tiles_k = self.tiles_k(problem)
        if self.split_k > tiles_k:
            bad("split-k", f"split_k={self.split_k} exceeds the {tiles_k} K tiles of K={problem.k}")
        if problem.batch * self.split_k > GRID_Y_MAX:
            bad("grid", f"batch {problem.batch} x split_k {self.split_k} exceeds the grid limit {GRID_Y_MAX}")
        tiles = self.output_tiles(problem)
        if tiles > INT32_MAX:
            bad("grid", f"{tiles} blocks exceed the grid limit {INT32_MAX}")
        if self.launch_kind == LaunchKind.STREAM_K and tiles * problem.batch * tiles_k > INT32_MAX:
            bad("size", f"{tiles * problem.batch * tiles_k} stream-K iterations exceed the kernel's 32-bit count")
        if max(problem.m, problem.n, problem.k) > INT32_MAX:
            bad("size", "a dimension exceeds 2^31-1, beyond the kernel's 32-bit indexing")

    def first_reasons(self, problem: Problem) -> tuple[list[str], object]:
        """(reasons, bad) started with the dtype and knob-value reasons, past which a family's
        `check` need not look (its sizes would be computed from values it cannot use)."""
        reasons, bad = self.reason_collector()
        reasons += self.dtype_reasons(problem)
        reasons += self.knob_reasons()
        return reasons, bad

    @staticmethod
    def reason_collector() -> tuple[list[str], object]:
        """(reasons, bad): `bad(code, message)` appends "code: message" to reasons."""
        reasons: list[str] = []

        def bad(code: str, message: str) -> None:
            reasons.append(f"{code}: {message}")

        return reasons, bad


class VectorizedLoads:
    """The vector-width rules of a family with a `vec` knob: A and B load up to `vec` elements at
    once where their alignment allows it; C as `c_width` says (by default element by element).
    Mixed in before GemmConfig."""

    widths_allowed: ClassVar[tuple[int, ...]] = (1, 2, 4, 8)
    vectorized_c: ClassVar[bool] = False  # whether C's width is checked (and may exceed 1)

    def c_width(self, aligned: Any) -> int:
        """C's width, given `aligned()`: the widest C's alignment allows."""
        return 1

    def packed_widths(self, problem: Problem) -> VectorWidths:
        """Vector widths for densely packed operands (leading dimension = row length)."""
        lda, ldb = packed_leading_dimensions(problem)
        if self.repacks_operands:  # a misaligned operand is copied to an aligned pitch first
            lda = ldb = self.vec
        return VectorWidths(a=widest_vector(self.vec, lda), b=widest_vector(self.vec, ldb),
                            c=self.c_width(lambda: widest_vector(self.vec, problem.n)))

    def vector_widths(self, a: Any, b: Any, c: Any, itemsize: int) -> VectorWidths:
        """The widest accesses, up to `vec`, that the operands' alignment allows (A and B at full
        width where the config repacks them: what is misaligned is copied to an aligned pitch), for
        A and B in the kernel's roles (swapped where the config swaps them)."""
        if self.swaps_operands:  # the kernel's A is the user's B, and its B the user's A
            a, b = b.in_other_role(), a.in_other_role()
        full = self.vec if self.repacks_operands else None
        return VectorWidths(a=full or a.vector_width(self.vec, itemsize), b=full or b.vector_width(self.vec, itemsize),
                            c=self.c_width(lambda: c.vector_width(self.vec, itemsize)))

    def check_widths(self, widths: VectorWidths) -> None:
        named = (("A", widths.a), ("B", widths.b)) + ((("C", widths.c),) if self.vectorized_c else ())
        allowed = ", ".join(map(str, self.widths_allowed[:-1])) + f" or {self.widths_allowed[-1]}"
        for operand, width in named:
            if width not in self.widths_allowed or width > self.vec:
                raise ValueError(f"vector width {width} for {operand} must be {allowed} and <= config vec {self.vec}")
