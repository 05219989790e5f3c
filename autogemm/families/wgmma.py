"""The tensor-core family's Hopper path (instruction "wgmma", template `wgmma_gemm.cu.j2`).

A warpgroup of 4 warps issues wgmma.mma_async m64nNk: the instruction's "B" operand is read from
shared memory K-major under the 128-byte swizzle (TF32 allows nothing else), its "A" operand from
registers. The problem's operand whose K is contiguous takes the shared-memory role (called Q); the
other (P) is fed from registers. When Q is A the kernel computes C^T = B^T A^T ("swap"), so that P
runs along N. wm x wn is a warpgroup's tile, in the problem's M and N.
"""

from __future__ import annotations
from typing import Any

from .. import dtypes
from ..dtypes import TensorCoreShapes
from ..problem import Device, Problem

WARPGROUP = 128  # threads of one warpgroup: 4 warps
ARCH = (9, 0)  # wgmma exists on sm_90a only: such kernels run on compute capability 9.0 alone
ARCH_SUFFIX = "a"  # the compilers are asked for sm_90a by name
ROWS_PER_INSTRUCTION = 64  # wgmma's M
N_MULTIPLE, N_MAX = 8, 256  # wgmma's N
SWIZZLE_BYTES = 128  # a shared-memory row of Q: one 128-byte swizzle row of K
SWIZZLE_PERIOD_BYTES = 1024  # eight rows; every Q tile starts on such a boundary
MIN_STAGES, MAX_STAGES = 3, 5  # slice t's wgmmas in flight while t+1 lands and t+2.. are requested

# register model (see `estimated_registers`): fitted with ptxas (sm_90a, CUDA 13) on 78 variants
# (TF32 and 16-bit, NN/NT/TT, with and without tails) so that none it accepts spills or serializes
REGISTER_OVERHEAD = 48
TAIL_REGISTERS = 24


def swaps_operands(problem: Problem) -> bool | None:
    """Whether Q (read K-major from shared memory) is A, so that the kernel computes C^T: B when
    B's K is contiguous (False), else A when A's is (True), else None: neither is (layout TN) and
    the path cannot run."""
    if problem.trans_b:
        return False
    if not problem.trans_a:
        return True
    return None


def tiles(config: Any, problem: Problem) -> tuple[int, int, int, int]:
    """Block and warpgroup extents along P (wgmma's M) and Q (its N): (pb, qb, pw, qw)."""
    if swaps_operands(problem):
        return config.bn, config.bm, config.wn, config.wm
    return config.bm, config.bn, config.wm, config.wn


def fragment(config: Any, problem: Problem, shapes: TensorCoreShapes) -> tuple[int, int, int]:
    """One instruction's m, n, k in the problem's M and N."""
    if swaps_operands(problem):
        return config.wm, ROWS_PER_INSTRUCTION, shapes.wgmma_k
    return ROWS_PER_INSTRUCTION, config.wn, shapes.wgmma_k


def smem_bytes(config: Any, problem: Problem, itemsize: int, pad: int) -> int:
    """Per stage: P's padded tile in its global orientation, rounded up to the swizzle period that
    aligns Q's swizzled tile after it; plus one period to align the first stage."""
    pb, qb, _, _ = tiles(config, problem)
    p_trans = (not problem.trans_b) if swaps_operands(problem) else problem.trans_a
    p = (config.bk * (pb + pad)) if p_trans else (pb * (config.bk + pad))
    p_bytes = -(-p * itemsize // SWIZZLE_PERIOD_BYTES) * SWIZZLE_PERIOD_BYTES
    return config.stages * (p_bytes + qb * config.bk * itemsize) + SWIZZLE_PERIOD_BYTES


def estimated_registers(config: Any, problem: Problem, wgmma_k: int) -> int:
    """Each warpgroup's accumulators (pw/64 blocks of qw/2 per thread) and P's fragments of a whole
    slice twice (the wgmmas of one slice read them while the next slice's load), addresses and
    loop state. It overestimates four-block warpgroup tiles, where ptxas does not keep both
    fragment buffers whole."""
    _, _, pw, qw = tiles(config, problem)
    blocks = pw // ROWS_PER_INSTRUCTION
    accumulators = blocks * qw // 2
    fragments = 2 * blocks * (config.bk // wgmma_k) * 4
    tails = config.even(problem) != "111"
    return accumulators + fragments + REGISTER_OVERHEAD + (TAIL_REGISTERS if tails else 0)


def reasons(config: Any, problem: Problem, device: Device, shapes: TensorCoreShapes, bad: Any) -> None:
    """What only the wgmma path asks: the type, the architecture, the layout and its tiles."""
    if not shapes.wgmma_k:
        served = [f"{row.name}/{row.compute}" for row in dtypes.ROWS if row.tensor_core and row.tensor_core.wgmma_k]
        bad("tensor-core", f"the wgmma path computes {', '.join(served)}, not {problem.dtype}/{problem.compute}")
        return
    if device.compute_capability != ARCH:
        bad("tensor-core", f"wgmma needs compute capability {ARCH[0]}.{ARCH[1]} (sm_90a), device is {device.arch}")
    swap = swaps_operands(problem)
    if swap is None:
        bad("layout", f"wgmma reads {problem.dtype} from shared memory K-major only: layout "
                      f"{problem.layout.upper()} has K contiguous in neither A nor B")
        return
    if not MIN_STAGES <= config.stages <= MAX_STAGES:
        bad("choice", f"stages={config.stages}: the wgmma ring needs {MIN_STAGES} to {MAX_STAGES} stages")
    _, _, pw, qw = tiles(config, problem)
    p_dim, q_dim = ("wn", "wm") if swap else ("wm", "wn")
    itemsize = dtypes.lookup(problem.dtype, problem.compute).itemsize
    atom = SWIZZLE_BYTES // itemsize
    if pw % ROWS_PER_INSTRUCTION or qw % N_MULTIPLE or qw > N_MAX or config.bk % atom:
        bad("fragment", f"{p_dim}={pw} must be a multiple of {ROWS_PER_INSTRUCTION} (wgmma rows), {q_dim}={qw} "
                        f"a multiple of {N_MULTIPLE} up to {N_MAX} (wgmma's N) and bk={config.bk} a multiple of "
                        f"{atom} (one {SWIZZLE_BYTES}-byte swizzled row) for layout {problem.layout.upper()}")
