"""The GEMV family: products with a short M (decode-like: a few rows of activations against a
long weight matrix), template `gemv_gemm.cu.j2`, for FP32, FP16, BF16 and FP64 on CUDA cores.

Such a product moves K x N elements of B for 2·M·K·N flops: it is bound by memory, and a tiled
GEMM's 64- or 128-row tiles waste most of their work and their SMs on it. Here a block keeps all BM
rows of an output tile in registers and reads each element of B once, with vector loads: B stored
K x N (N contiguous) has its threads side by side along N, and several thread groups share the
block's K slice; B stored N x K (K contiguous, a weight read as y = x·Wᵀ) has each warp's lanes
side by side along K, adding up with shuffles. Split-K spreads a long K over more blocks; the
last block of a tile to finish adds the splits' partial sums up (no second kernel: at a few
microseconds for the whole product, a second launch would cost a tenth of it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .. import dtypes
from ..problem import Device, Problem
from .base import WARP, GemmConfig, VectorizedLoads, VectorWidths, cxx_bool, swap_knob
from .knobs import Knob
from .launch_kind import LaunchKind

MAX_ROWS = 16  # BM: rows of M a block keeps in registers (the family is for short M)
# M (or N: the kernels swap the operands' roles) at or below which a product is GEMV-like: the GEMV
# kernels keep all of a tile's rows in registers and read B once; above it, B would be read again
# per tile of rows
GEMV_MAX_M = 16
MAX_VECTOR_BYTES = 16  # one global load: at most 16 bytes
MAX_SHARED_PARTIALS = 48 * 1024  # static shared memory of the cross-group sums (bytes)
# accumulators plus the values of B (and A) a thread holds at once: beyond this ptxas spills
MAX_THREAD_VALUES = 96
# registers a thread needs, conservatively: two per value held (ptxas keeps loads and their
# conversions apart, and hoists the next row's loads) plus indices, pointers and bounds
REGISTERS_PER_VALUE = 2
REGISTER_OVERHEAD = 40
MAX_K_SLICE = 1 << 16

KNOBS = (
    Knob("bm", int, 4, code="m", join="", low=1, high=MAX_ROWS, power_of_two=True),
    Knob("bn", int, 256, code="n", low=1, high=1024, power_of_two=True),
    Knob("bk", int, 256, code="k", low=1, high=MAX_K_SLICE, power_of_two=True),
    Knob("warps", int, 4, code="w", low=1, high=32),
    Knob("vec", int, 4, code="v", choices=(1, 2, 4, 8)),
    # rows of B loaded before their products (B stored K x N only): loads in flight per thread
    Knob("unroll", int, 4, code="u", choices=(1, 2, 4, 8)),
    Knob("split_k", int, 1, code="s", low=1, high=65535),
    Knob("min_blocks", int, 1, code="o", low=1, high=32),
    # compute C^T = B^T A^T: a short N becomes the short side the block keeps in registers (the
    # kernel reads B as its first operand, A as its second, and writes C transposed)
    swap_knob(),
)


def is_short(problem: Problem) -> bool:
    """Whether M or N is short enough for the product to be GEMV-like (`GEMV_MAX_M`)."""
    return min(problem.m, problem.n) <= GEMV_MAX_M


# Built-in configurations for problems nothing was tuned for (the GPU tests run them).
DEFAULTS = (
    ("small", "gemv_m4_n256_k256_w4_v4_u4_s1_o1"),
    ("small", "gemv_m1_n32_k32_w1_v1_u1_s1_o1"),
)


class GemvConfig(VectorizedLoads, GemmConfig):
    family = "gemv"
    family_applies_epilogue = True  # (store_output and finish_split: after the split-K sum, once)
    writes_other_dtypes = True
    label = "GEMV"
    name_prefix = "gemv_"
    knobs = KNOBS
    if TYPE_CHECKING:  # the knobs' fields as type checkers see them: knobs.knob_fields(KNOBS), checked by tests
        bm: int = 4
        bn: int = 256
        bk: int = 256
        warps: int = 4
        vec: int = 4
        unroll: int = 4
        split_k: int = 1
        min_blocks: int = 1
        swap: bool = False
    template = "gemv_gemm.cu.j2"
    space_constants: ClassVar[dict[str, Any]] = {"WARP": WARP}
    search_space = "gemv"
    candidate_order = -1  # searched first: the GEMV kernels win the memory-bound products outright

    @classmethod
    def candidate_for(cls, problem: Problem, device: Device | None = None) -> bool:
        """A short M or N (a short N served with the operands' roles swapped), in a dtype and compute
        mode the family computes (every dtype in its default mode: the products run on CUDA cores,
        the `other_families` column of dtypes). The two spaces win on different shapes: the GEMV
        kernels on memory-bound products, tiled split-K where K is long against N."""
        return is_short(problem) and cls.compute_for(problem.dtype) == problem.compute

    @classmethod
    def defaults(cls, problem: Problem) -> tuple[tuple[str, str], ...]:
        return DEFAULTS

    @property
    def threads(self) -> int:
        return self.warps * WARP

    @property
    def swaps_operands(self) -> bool:
        return self.swap is True

    @property
    def launch_kind(self) -> LaunchKind:
        return LaunchKind.SPLIT_K_FUSED if self.split_k > 1 else LaunchKind.TILES

    def reduce_kernel(self, kernel: str) -> str | None:
        return None  # the splits are added up by the kernel itself

    def held_values(self, problem: Problem) -> int:
        """Accumulators and loaded values a thread holds at once."""
        if self.k_contiguous_b(problem):
            columns = self.bn // self.warps
            return (self.bm + self.vec) * columns + self.vec
        return (self.bm + self.unroll) * self.vec + self.unroll  # (+ a row's values of A)

    def estimated_registers(self, problem: Problem) -> int:
        return REGISTERS_PER_VALUE * self.held_values(problem) + REGISTER_OVERHEAD

    def k_contiguous_b(self, problem: Problem) -> bool:
        """Whether B is stored N x K (its rows run along K): the lanes-along-K path."""
        return problem.trans_b

    def even(self, problem: Problem) -> str:
        # K needs no flag: every K slice is bounded by K itself
        return "".join("1" if extent % tile == 0 else "0" for extent, tile in ((problem.m, self.bm), (problem.n, self.bn))) + "0"

    # ---- validity ------------------------------------------------------------------------------
    def check(self, problem: Problem, device: Device) -> list[str]:
        reasons, bad = self.first_reasons(problem)
        if reasons:
            return reasons
        problem = self.kernel_problem(problem)  # below: the product the kernel computes
        row = dtypes.lookup(problem.dtype, problem.compute)
        itemsize, accumulator = row.itemsize, row.accumulator_size
        if self.vec * itemsize > MAX_VECTOR_BYTES:
            bad("tile-load", f"vec={self.vec} elements of {itemsize} bytes exceed a {MAX_VECTOR_BYTES}-byte load")
        if self.bk % self.vec:
            bad("tile-load", f"K slice {self.bk} is not a multiple of vector width {self.vec}")
        if self.bk % self.unroll:
            bad("tile-load", f"K slice {self.bk} is not a multiple of the {self.unroll} rows taken at once")
        if self.threads > device.max_threads_per_block:
            bad("threads", f"{self.threads} threads per block exceed the device limit {device.max_threads_per_block}")
        if self.k_contiguous_b(problem):
            if self.bn % self.warps:
                bad("warp-tile", f"{self.bn} columns do not split over {self.warps} warps")
            elif (self.bm + self.vec) * (self.bn // self.warps) + self.vec > MAX_THREAD_VALUES:
                bad("registers", f"{self.bm} rows x {self.bn // self.warps} columns a warp, with {self.vec}-wide "
                                 f"loads of each column, hold more than {MAX_THREAD_VALUES} values per lane")
        else:
            # (the thread layout is the config's: narrower loads, where B's alignment asks for them,
            # load each thread's vec columns in more pieces)
            lanes_n = self.bn // self.vec
            if self.bn % self.vec or lanes_n == 0 or self.threads % lanes_n:
                bad("thread-tile", f"{self.threads} threads do not cover {self.bn} columns in groups of "
                                   f"{self.bn // max(self.vec, 1)} threads of {self.vec} columns")
            elif (self.threads // lanes_n) * (self.bn + 1) * accumulator > MAX_SHARED_PARTIALS:  # rows padded by 1
                bad("shared-memory", f"{self.threads // lanes_n} thread groups x {self.bn} columns of partial sums "
                                     f"exceed {MAX_SHARED_PARTIALS} bytes of static shared memory")
            elif (self.bm + self.unroll) * self.vec > MAX_THREAD_VALUES:
                bad("registers", f"{self.bm} rows x {self.vec} columns of accumulators and {self.unroll} rows of B "
                                 f"in flight hold more than {MAX_THREAD_VALUES} values per thread")
        if not reasons:
            regs, limit = self.estimated_registers(problem), self.register_limit(device)
            if regs > limit:
                bad("registers", f"about {regs} registers per thread exceed the {limit} that {self.min_blocks} "
                                 f"block(s) of {self.threads} threads per SM leave")
        self.launch_reasons(problem, device, 0, bad)
        return reasons

    # ---- vector widths -------------------------------------------------------------------------
    def vector_widths(self, a: Any, b: Any, c: Any, itemsize: int) -> VectorWidths:
        return self._loaded(super().vector_widths(a, b, c, itemsize))

    def packed_widths(self, problem: Problem) -> VectorWidths:
        return self._loaded(super().packed_widths(problem))

    def _loaded(self, widths: VectorWidths) -> VectorWidths:
        """A is read element by element except along K beside a K-contiguous B, never wider than
        B's loads (they share the K step); C is written element by element."""
        return VectorWidths(a=min(widths.a, widths.b), b=widths.b, c=1)

    def check_widths(self, widths: VectorWidths) -> None:
        super().check_widths(widths)
        if widths.a > widths.b:
            raise ValueError(f"A's vector width {widths.a} exceeds B's {widths.b}: they share the K step")

    def a_width(self, problem: Problem, widths: VectorWidths) -> int:
        """Elements per load of A along K: none where A is stored K x M; beside a K-contiguous B, as
        wide as B's loads allow (they share the K step); beside an N-contiguous B, up to the rows
        of B a thread takes at once (consecutive, so its values of A are too)."""
        if problem.trans_a:
            return 1
        return widths.a if self.k_contiguous_b(problem) else min(widths.a, self.unroll)

    # ---- rendering -----------------------------------------------------------------------------
    def kernel_name(self, problem: Problem, widths: VectorWidths) -> str:
        return f"ag_{self.name}_{problem.dtype}_{problem.layout}_e{self.even(problem)}_v{widths}"

    def context(self, problem: Problem, widths: VectorWidths) -> dict[str, Any]:
        row = dtypes.lookup(problem.dtype, problem.compute)
        k_contiguous = self.k_contiguous_b(problem)
        return dict(
            dtype=problem.dtype, compute=problem.compute, layout=problem.layout.upper(),
            element=row.element, accumulator=row.accumulator, element_bytes=row.itemsize,
            to_acc=row.to_acc, from_acc=row.from_acc, bm=self.bm, bn=self.bn, bk=self.bk,
            threads=self.threads, va=self.a_width(problem, widths), vb=widths.b,
            vec=self.vec, unroll=self.unroll, split_k=self.split_k, min_blocks=self.min_blocks,
            k_contiguous_b=k_contiguous,
            trans_a=cxx_bool(problem.trans_a), trans_b=cxx_bool(problem.trans_b), **self.even_flags(problem),
            c_transposed=cxx_bool(self.swaps_operands),
        )
