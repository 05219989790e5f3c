"""The tensor-core family: TF32, FP16, BF16 (FP32 accumulation) and FP64 GEMM on tensor cores, over
one set of tiles and one cp.async pipeline, with three instruction paths (knob `instruction`):

- "wmma": nvcuda::wmma fragments (16x16 blocks, FP64 8x8x4), written out through a per-warp
  staging tile (`wmma_gemm.cu.j2`);
- "mma": PTX mma.sync on 16x8 blocks, fragments from `ldmatrix` (16-bit types, and TF32 where K is
  contiguous in shared memory) or element by element, double-buffered in registers, accumulators
  stored straight from registers (`wmma_gemm.cu.j2`, names ending `_mma`);
- "wgmma": Hopper's warpgroup wgmma.mma_async (sm_90a), one operand read from 128-byte-swizzled
  shared memory, the other from registers; wm x wn is then a warpgroup's tile
  (`wgmma_gemm.cu.j2`, names ending `_wgmma`; see `families.wgmma`).

The family's name in records and config names stays "wmma", as it was before the other paths came.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .. import dtypes
from ..problem import Device, Problem
from . import wgmma
from .base import WARP, GemmConfig, VectorizedLoads, VectorWidths, cxx_bool, grid_knobs, tile_knobs
from .knobs import Knob

FIRST_ASYNC_STAGE = 2  # every pipelined stage count is a cp.async ring
MAX_LOAD_BYTES = 16  # the widest global load (and cp.async copy)
# Bytes added to every shared-memory row. 16 shifts each row by 4 banks, so that the 8 rows of a
# 16-bit fragment load (16 bytes each) hit 8 bank groups; the wider TF32 and FP64 fragment rows
# need larger shifts for some layouts.
PAD_BYTES = {"plain": 0, "pad": 16, "pad32": 32, "pad64": 64}
INSTRUCTIONS = ("wmma", "mma", "wgmma")

KNOBS = (
    # the warp tile is a grid of instruction blocks; with wgmma it is a warpgroup's tile
    *tile_knobs(128, 128, 32, 64, 64),
    # elements per global load (cp.async copies of 4, 8 or 16 bytes)
    Knob("vec", int, 8, code="v", power_of_two=True, low=1, high=MAX_LOAD_BYTES),
    # 1 single buffer, 2-5 a cp.async ring
    Knob("stages", int, 3, code="s", low=1, high=5),
    # padding of every shared-memory row (operands stay in their global orientation there)
    Knob("smem", str, "pad", choices=tuple(PAD_BYTES)),
    *grid_knobs(),
    Knob("instruction", str, "wmma", choices=INSTRUCTIONS, omitted="wmma", words={"mma": "mma", "wgmma": "wgmma"}),
)

# ---- register models --------------------------------------------------------------------------------
# Conservative counts of a thread's registers, fitted with ptxas (sm_90, CUDA 13) so that no
# accepted variant spills (NOTES.md has the fits); the wgmma path's are in families.wgmma.
WMMA_REGISTER_OVERHEAD = 66  # addresses, indices, loop state
WMMA_REGISTERS_PER_LOAD = 3  # every global load of a slice keeps a 64-bit address and its bounds
WMMA_REGISTERS_FOR_TAILS = 100  # bounds checks on partial tiles keep many more addresses live
WMMA_FP64_FRAGMENTS = 40  # ptxas keeps FP64 WMMA fragments of more k-steps live than it needs
MMA_REGISTER_OVERHEAD = 48  # fitted on ~80 variants
MMA_REGISTER_OVERHEAD_TF32 = 56  # the round-to-TF32 conversions need temporaries
MMA_TAIL_REGISTERS_16BIT = 60  # bounds on every 8-element copy of every pass
MMA_TAIL_REGISTERS_PER_PASS = 12
MMA_TAIL_REGISTERS = 10

# Built-in configurations per (dtype, compute), largest first. Hopper's wgmma first (the first of
# them for NN, the second for NT/TT: the register fit rejects each in the other's layouts), then
# mma.sync (other devices, layout TN), then WMMA (FP64 before sm_90, small problems).
_SIXTEEN_BIT_DEFAULTS = (("large", "wmma_256x128x64_w256x64_v8_s4_pad_g8_k1_o1_wgmma"),
                         ("large", "wmma_128x256x64_w64x256_v8_s4_pad_g8_k1_o1_wgmma"),
                         ("large", "wmma_128x256x64_w64x64_v8_s3_pad_g8_k1_o1_mma"),
                         ("large", "wmma_128x128x32_w64x64_v8_s3_pad_g8_k1_o1"),
                         ("medium", "wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o1_mma"),
                         ("medium", "wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o1"),
                         ("small", "wmma_32x32x16_w16x32_v8_s2_pad_g8_k1_o1"))
DEFAULTS: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    ("float16", "fp32"): _SIXTEEN_BIT_DEFAULTS,
    ("bfloat16", "fp32"): _SIXTEEN_BIT_DEFAULTS,
    ("float32", "tf32"): (("large", "wmma_256x128x32_w256x64_v4_s4_pad32_g8_k1_o1_wgmma"),
                          ("large", "wmma_128x256x32_w64x256_v4_s4_pad32_g8_k1_o1_wgmma"),
                          ("large", "wmma_128x256x32_w64x64_v4_s3_pad32_g8_k1_o1_mma"),
                          ("large", "wmma_128x128x16_w32x64_v4_s4_pad_g8_k1_o1"),
                          ("medium", "wmma_64x64x16_w32x32_v4_s3_pad32_g8_k1_o1_mma"),
                          ("medium", "wmma_64x64x16_w32x32_v4_s3_pad_g8_k1_o1"),
                          ("small", "wmma_32x32x8_w16x32_v4_s2_pad_g8_k1_o1")),
    ("float64", "fp64"): (("large", "wmma_64x128x16_w32x32_v2_s4_pad32_g8_k1_o1_mma"),
                          ("large", "wmma_64x64x8_w32x32_v2_s4_pad_g8_k1_o1"),
                          ("medium", "wmma_32x32x8_w16x16_v2_s3_pad32_g8_k1_o1_mma"),
                          ("medium", "wmma_32x32x4_w16x16_v1_s3_pad_g8_k1_o1"),
                          ("small", "wmma_16x16x4_w8x16_v1_s2_pad_g8_k1_o1")),
}


class TensorCoreConfig(VectorizedLoads, GemmConfig):
    """A configuration of the tensor-core family (WMMA, mma.sync and Hopper's wgmma): block and warp
    tiles, the instruction, vector width, stages, shared-memory layout, block swizzle and split-K.
    `name` is its short form, `check(problem, device)` the reasons it cannot run there."""

    family = "wmma"
    family_applies_epilogue = True  # (in its store, from the accumulators: templates/common.cuh.j2)
    label = "WMMA"
    name_prefix = "wmma_"
    knobs = KNOBS
    if TYPE_CHECKING:  # the knobs' fields as type checkers see them: knobs.knob_fields(KNOBS), checked by tests
        bm: int = 128
        bn: int = 128
        bk: int = 32
        wm: int = 64
        wn: int = 64
        vec: int = 8
        stages: int = 3
        smem: str = 'pad'
        group_m: int = 8
        split_k: int = 1
        min_blocks: int = 1
        instruction: str = 'wmma'
    space_constants: ClassVar[dict[str, Any]] = {"WARP": WARP, "WARPGROUP": wgmma.WARPGROUP}

    @classmethod
    def upgrade_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        # records written before the `instruction` knob carry two booleans
        mma, wgmma_path = data.pop("mma", False), data.pop("wgmma", False)
        if mma or wgmma_path:
            data.setdefault("instruction", "wgmma" if wgmma_path else "mma")
        return data

    @classmethod
    def defaults(cls, problem: Problem) -> tuple[tuple[str, str], ...]:
        return DEFAULTS.get((problem.dtype, problem.compute), ())

    @property
    def template(self) -> str:
        return "wgmma_gemm.cu.j2" if self.instruction == "wgmma" else "wmma_gemm.cu.j2"

    @property
    def arch_suffix(self) -> str:
        return wgmma.ARCH_SUFFIX if self.instruction == "wgmma" else ""

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        # the wm x wn tile belongs to a warp, or with wgmma to a warpgroup of 4 warps
        return (self.bm // self.wm) * (self.bn // self.wn) * (wgmma.WARPGROUP if self.instruction == "wgmma" else WARP)

    def fragment(self, problem: Problem) -> tuple[int, int, int]:
        """The m, n, k of one instruction of this config's path (wgmma: in the problem's M and N,
        which the kernel swaps when it computes C^T)."""
        shapes = dtypes.lookup(problem.dtype, problem.compute).tensor_core
        if self.instruction == "wgmma":
            return wgmma.fragment(self, problem, shapes)
        return shapes.mma if self.instruction == "mma" else shapes.wmma

    def smem_pad(self, problem: Problem) -> int:
        """Padding of every shared-memory row, in elements."""
        return PAD_BYTES.get(self.smem, 0) // dtypes.lookup(problem.dtype, problem.compute).itemsize

    def smem_bytes(self, problem: Problem) -> int:
        """Dynamic shared memory of the kernel."""
        row = dtypes.find(problem.dtype, problem.compute)
        if row is None or row.tensor_core is None:
            return 0
        pad = self.smem_pad(problem)
        if self.instruction == "wgmma":
            return wgmma.smem_bytes(self, problem, row.itemsize, pad)
        # each operand tile keeps its global orientation: rows of bk (k contiguous) or of bm/bn
        a = (self.bk * (self.bm + pad)) if problem.trans_a else (self.bm * (self.bk + pad))
        b = (self.bn * (self.bk + pad)) if problem.trans_b else (self.bk * (self.bn + pad))
        pipeline = max(1, self.stages) * (a + b) * row.itemsize
        if self.instruction == "mma":
            return pipeline  # accumulators go out straight from registers
        fm, fn, _ = row.tensor_core.wmma
        epilogue = (self.threads // WARP) * fm * fn * row.accumulator_size  # one fragment per warp
        return max(pipeline, epilogue)

    def _tails(self, problem: Problem) -> bool:
        return self.even(problem) != "111"

    def estimated_registers(self, problem: Problem) -> int:
        """Registers per thread: accumulators and operand fragments of a warp tile spread over 32
        lanes (4-byte registers), addresses and loop state."""
        row = dtypes.lookup(problem.dtype, problem.compute)
        if self.instruction == "wgmma":
            return wgmma.estimated_registers(self, problem, row.tensor_core.wgmma_k)
        passes = (self.bm + self.bn) * self.bk // max(self.threads * self.vec, 1)
        accumulators = self.wm * self.wn * row.accumulator_size // 128
        if self.instruction == "mma":
            # two k-steps of fragments (the register double buffer)
            words = row.itemsize // 4 or 1  # 32-bit registers per fragment element (FP64: 2)
            fragments = 2 * (self.wm // 16 * 4 + self.wn // 8 * 2) * words
            overhead = MMA_REGISTER_OVERHEAD_TF32 if problem.compute == "tf32" else MMA_REGISTER_OVERHEAD
            tail_cost = (MMA_TAIL_REGISTERS_16BIT + MMA_TAIL_REGISTERS_PER_PASS * passes) if row.itemsize == 2 \
                else MMA_TAIL_REGISTERS
            return accumulators + fragments + overhead + passes // 2 + (tail_cost if self._tails(problem) else 0)
        # ptxas loads the TF32 and FP64 fragments of every k-step of a slice ahead of the mmas,
        # the 16-bit ones a step at a time unless the slice is deep
        _, _, fk = row.tensor_core.wmma
        depth = fk if row.itemsize == 2 and self.bk <= 2 * fk else self.bk
        fragments = (self.wm + self.wn) * depth * row.itemsize // 128 + (WMMA_FP64_FRAGMENTS if row.itemsize == 8 else 0)
        return (accumulators + fragments + WMMA_REGISTERS_PER_LOAD * passes + WMMA_REGISTER_OVERHEAD
                + (WMMA_REGISTERS_FOR_TAILS if self._tails(problem) else 0))

    # ---- validity ------------------------------------------------------------------------------
    def check(self, problem: Problem, device: Device) -> list[str]:
        """Every reason this configuration cannot run `problem` on `device` (empty: it can)."""
        reasons, bad = self.reason_collector()
        reasons += self.dtype_reasons(problem)
        if reasons:
            return reasons
        row = dtypes.lookup(problem.dtype, problem.compute)
        shapes = row.tensor_core
        if self.instruction == "wgmma":
            wgmma.reasons(self, problem, device, shapes, bad)
        elif self.instruction in INSTRUCTIONS:
            min_arch = shapes.mma_arch if self.instruction == "mma" else shapes.wmma_arch
            if device.compute_capability < min_arch:
                path = "mma.sync" if self.instruction == "mma" else "WMMA"
                bad("tensor-core", f"{problem.dtype}/{problem.compute} {path} needs compute capability "
                                   f"{min_arch[0]}.{min_arch[1]}, device is {device.arch}")
        reasons += self.knob_reasons()
        if self.vec >= 1 and self.vec & (self.vec - 1) == 0 and self.vec * row.itemsize > MAX_LOAD_BYTES:
            bad("choice", f"vec={self.vec} elements of {row.itemsize} bytes exceed a {MAX_LOAD_BYTES}-byte load")
        if reasons:
            return reasons

        fm, fn, fk = self.fragment(problem)
        # the mma path loads B fragments of two adjacent 8-column blocks at once
        wn_multiple = 2 * fn if self.instruction == "mma" else fn
        # (the wgmma path's shapes were checked with its other reasons)
        if self.instruction != "wgmma" and (self.wm % fm or self.wn % wn_multiple or self.bk % fk):
            bad("fragment", f"warp tile {self.wm}x{self.wn} and bk={self.bk} must be multiples of "
                            f"{fm}x{wn_multiple}x{fk} for the {fm}x{fn}x{fk} {problem.dtype} "
                            f"{'mma.sync' if self.instruction == 'mma' else 'WMMA'} fragment")
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
        self.launch_reasons(problem, device, smem, bad, cp_async=self.stages >= FIRST_ASYNC_STAGE)
        return reasons

    # ---- rendering -----------------------------------------------------------------------------
    def kernel_name(self, problem: Problem, widths: VectorWidths) -> str:
        return (f"ag_{self.name}_{problem.dtype}_{problem.compute}_{problem.layout}_e{self.even(problem)}"
                f"_v{widths.a}x{widths.b}")

    def context(self, problem: Problem, widths: VectorWidths) -> dict[str, Any]:
        """What the skeleton of this config's instruction path needs besides the kernel's name."""
        if self.compute_for(problem.dtype) != problem.compute:
            raise ValueError(f"the WMMA template has no kernel for {problem.dtype}/{problem.compute}")
        row = dtypes.lookup(problem.dtype, problem.compute)
        swap = wgmma.swaps_operands(problem) if self.instruction == "wgmma" else False
        if swap is None:
            raise ValueError(f"the wgmma path cannot read layout {problem.layout.upper()}: "
                             "K is contiguous in neither operand")
        fm, fn, fk = self.fragment(problem)
        return dict(
            dtype=problem.dtype, compute=problem.compute, layout=problem.layout.upper(),
            element=row.element, accumulator=row.accumulator, precision=row.tensor_core.wmma_precision,
            mma=self.instruction == "mma", mma_shape=f"m{fm}n{fn}k{fk}", swap=cxx_bool(swap),
            qw=self.wm if swap else self.wn,  # wgmma's N
            mma_input=row.tensor_core.mma_input, element_bytes=row.itemsize,
            to_acc=row.to_acc, from_acc=row.from_acc, fm=fm, fn=fn, fk=fk,
            bm=self.bm, bn=self.bn, bk=self.bk, wm=self.wm, wn=self.wn, va=widths.a, vb=widths.b,
            stages=self.stages, buffers=max(1, self.stages), use_cp_async=cxx_bool(self.stages >= FIRST_ASYNC_STAGE),
            smem_bytes=self.smem_bytes(problem), warpgroup=wgmma.WARPGROUP, swizzle_bytes=wgmma.SWIZZLE_BYTES,
            swizzle_period=wgmma.SWIZZLE_PERIOD_BYTES, group_m=self.group_m, split_k=self.split_k,
            min_blocks=self.min_blocks, pad=self.smem_pad(problem),
            trans_a=cxx_bool(problem.trans_a), trans_b=cxx_bool(problem.trans_b), **self.even_flags(problem),
        )
