"""What a Hopper configuration asks of a problem beyond the family's common rules (HopperConfig.check): its
tile's shape, its operands' layout, a grouped product's, an FP8 product's, and each knob's. Each function adds
its reasons through `bad`, as `check` does, for `config`, a HopperConfig."""

from __future__ import annotations

from typing import Any

from .. import dtypes
from ..epilogue import BLOCK, FAST_FORM_ACTIVATIONS
from ..problem import Device, Problem
from . import wgmma
from .wgmma import ROWS_PER_INSTRUCTION, SWIZZLE_BYTES

TMA_ALIGN_BYTES = 16  # address, pitch and batch stride of an operand TMA reads
MAX_CONSUMERS = 2
# a consumer's A fragments with A from registers: two slices' worth (one in flight, one loading) of
# 4 registers per m64 block and k-step, on top of the accumulators, within the consumer's registers
MAX_ACCUMULATORS_AND_FRAGMENTS = 160
# bn's step where B is K-major and C is stored from registers (16-bit types): wgmma's N steps by 8, and so do
# a thread's accumulators (four per 8 columns: two rows of a pair), split-K's float4 slots (the four of a block of
# 8 columns) and the overlapping TMA store's chunks (whole blocks of 8): 256 x 11008 in 128 x 168 tiles is 132
NARROW_BN_STEP = 8
# split N's consumer width where B is K-major: its shared chunk's pairs of columns and its 16-column steps
SPLIT_N_WN_STEP = 16
# stream-K's fix-up adds up FIX_UP_VALUES (8 or 16) accumulators at a time: a divisor of bn / 2
STREAM_K_BN_STEP = 16
# a grouped product's groups at most: the prefix of their row-tile counts is kept in shared memory, a
# static array padded (like the split flags) to whole swizzle periods: 2048 bytes, as ptxas reports
MAX_GROUPS = 256
# block scales: the widest tile whose columns lie in two of B's 128-column blocks at most (its first
# column a multiple of bn, itself a multiple of 64)
MAX_BLOCK_SCALED_BN = 192
# with block scales (FP8), the accumulators and two sets of partial sums (one slice promoted while the
# next one's wgmmas run), or one set on tiles too wide for two, within the consumer's registers: a
# 64 x 128 tile's 3 x 64 and a 64 x 192 tile's 2 x 96 compile without spills
MAX_BLOCK_SCALED_VALUES = 192
# ping-pong consumers with split-K and a fused epilogue (not FP8): the widest tile that compiles without spills.
# 208-256 wide spilled 8-20 bytes (ptxas, BF16, bias / GELU / bias + SiLU / a bias along M, K split 2 or 3, each
# width with some of them), 176 and 192 none
MAX_PINGPONG_SPLIT_EPILOGUE_BN = 192
# tiles wider than one wgmma's 256 columns: cuBLAS runs 320 x 128 tiles (nvjet_sm90_tst_320x128_64x3_1x2, in our
# M x N 128 x 320) on BF16 products of 4096 rows and more on an H200
WIDE_BN = (320,)


def tile_reasons(config: Any, problem: Problem, kernel: Problem, bad) -> None:
    """The tile's shape: the consumers' tiles within the block's, wgmma's and the swizzle's steps, the
    accumulators within a consumer's registers, ping-pong's two consumers on a persistent grid (and its width with
    split-K and an epilogue). `kernel` is the problem whose layout the kernel reads."""
    row = dtypes.lookup(problem.dtype, problem.compute)
    atom = SWIZZLE_BYTES // row.itemsize
    # bn: a multiple of the kernel's 64-column step (its static_assert), which is also a whole number of
    # swizzled rows where B or C lie along N (64 16-bit or 32 FP32 columns a row; FP8's B is K-major, its
    # D stored in chunks of 128 bytes of D's type). A 16-bit kernel whose B is K-major and whose C goes
    # from registers, or through TMA in 64-column chunks the last of which overlaps the one before (swapped: in
    # transposed pieces of wm columns, the last wm overlapping, which layout_reasons bounds; not split N or by
    # stmatrix, whose chunks are whole; nor with a residual read at its use, whose columns in common would be read
    # again after the chunk before had stored them, were it D itself: with preload each chunk's residual is copied
    # before the chunk before is stored, and a residual that cannot be copied so goes from registers), steps by
    # NARROW_BN_STEP (wgmma's N steps by 8; B's boxes are bn rows of K): 640 rows of 4096 columns fill 130 of 132
    # SMs with 128 x 160 tiles, where 128 x 192 fill 110
    narrow_store = not config.tma_store or (config.bn > atom and not (
        config.split_n or config.stmatrix or (problem.epilogue.residual and not config.preload)))
    narrow = config.transposes(problem) and kernel.trans_b and narrow_store
    bn_step = NARROW_BN_STEP if narrow else 64
    spans_columns = config.wn == config.bn and config.bm % config.wm == 0
    splits_columns = config.wm == config.bm and config.bn == MAX_CONSUMERS * config.wn
    if not (spans_columns or splits_columns) or not 1 <= config.consumers <= MAX_CONSUMERS:
        bad("warp-tile", f"a consumer's tile {config.wm}x{config.wn} must span the block's {config.bn} columns "
                         f"and 1 or {MAX_CONSUMERS} of them its {config.bm} rows, or span its rows and "
                         f"{MAX_CONSUMERS} of them its columns (split N)")
    elif config.split_n:
        split_n_reasons(config, problem, kernel, bad)
    if config.wide:
        wide_reasons(config, problem, bad)
    elif config.wm % ROWS_PER_INSTRUCTION or config.bn % bn_step or config.bn > wgmma.N_MAX or config.bk % atom:
        bad("fragment", f"wm={config.wm} must be a multiple of {ROWS_PER_INSTRUCTION} (wgmma rows), bn={config.bn} "
                        f"a multiple of {bn_step} up to {wgmma.N_MAX} (wgmma's N, whole swizzled rows"
                        f"{'' if narrow else f'; {NARROW_BN_STEP} for 16-bit types with B K-major, C stored from '}"
                        f"{'' if narrow else 'registers or, without a residual read at its use, through TMA'}) "
                        f"and bk={config.bk} a multiple of {atom} ({SWIZZLE_BYTES}-byte rows)")
    if config.tall_and_wide:
        tall_reasons(config, problem, bad)
    if config.accumulators() > config.max_accumulators():
        bad("registers", f"{config.accumulators()} accumulators per consumer thread (tile {config.wm}x{config.wn}) "
                         f"exceed {config.max_accumulators()}")
    if config.pingpong and config.consumers != MAX_CONSUMERS:
        bad("warp-tile", f"pingpong needs {MAX_CONSUMERS} consumers to take turns, the tile {config.bm}x{config.bn} "
                         f"has {config.consumers}")
    if config.pingpong and not config.persistent:
        bad("grid", "pingpong needs a persistent grid (with a block per tile the second consumer would idle)")
    if config.pingpong and config.split_k > 1 and not problem.epilogue.is_identity and not row.scaled \
            and config.bn > MAX_PINGPONG_SPLIT_EPILOGUE_BN:
        bad("registers", f"pingpong with split_k={config.split_k} and a fused epilogue spills registers on tiles wider "
                         f"than {MAX_PINGPONG_SPLIT_EPILOGUE_BN} (bn={config.bn})")


def wide_reasons(config: Any, problem: Problem, bad) -> None:
    """A tile wider than one wgmma (WIDE_BN: cuBLAS's 320-wide tile): each consumer of 64 rows issues two wgmmas
    per k-step, of 256 columns and of the rest, and B's K-major slice comes in two boxes of bn / 2 rows. Written for
    the plain 16-bit kernel so far: consumers that span the columns, no split of K, no grouped product, unswapped."""
    row = dtypes.lookup(problem.dtype, problem.compute)
    atom = SWIZZLE_BYTES // row.itemsize
    if config.bn not in WIDE_BN or config.wm != ROWS_PER_INSTRUCTION or config.bk % atom:
        bad("fragment", f"a tile wider than wgmma's {wgmma.N_MAX} columns is one of bn={list(WIDE_BN)} with "
                        f"wm={ROWS_PER_INSTRUCTION} and bk a multiple of {atom} ({SWIZZLE_BYTES}-byte rows), not "
                        f"bn={config.bn}, wm={config.wm}, bk={config.bk}")
    for knob, on in (("split_n", config.split_n), ("split_k", config.split_k > 1), ("stream_k", config.stream_k),
                     ("stmatrix", config.stmatrix)):
        if on:
            bad("wide", f"a tile wider than {wgmma.N_MAX} columns (bn={config.bn}) is written for the plain kernel: "
                        f"{knob}={getattr(config, knob)} does not go with it")
    if row.scaled or not config.transposes(problem):
        bad("dtype", f"a tile wider than {wgmma.N_MAX} columns is written for 16-bit products, not "
                     f"{problem.dtype}/{problem.compute}")
    if problem.grouped:
        bad("grouped", f"a tile wider than {wgmma.N_MAX} columns: a grouped product's tiles are not written for it")
    if not config.hoisted_descriptors:
        bad("choice", "a tile wider than one wgmma steps to its second piece from the slice's hoisted descriptor: "
                      "it needs hoisted_descriptors")
    if config.swap:
        # (swapped, the transposed store's addressing beside 160 accumulators spilled 40-52 bytes: nvcc 13, sm_90a,
        # BF16 4096 x 14336 x 4096 NN, NT and TT, with and without a cluster or ping-pong)
        bad("registers", f"a tile wider than {wgmma.N_MAX} columns with swap spills registers (bn={config.bn})")


def tall_reasons(config: Any, problem: Problem, bad) -> None:
    """A consumer of two m64 blocks more than 128 columns wide (128 x 144: two make a 256 x 144 tile), with 144
    accumulators a thread: written for the plain 16-bit kernel. nvcc 13 (sm_90a, BF16 and FP16, layouts NT, TT and
    (swapped) NN, no epilogue, a bias, GELU, SiLU and residuals, 3 and 4 stages, with and without the TMA store and
    ping-pong) compiled it without spills except with an activation's values preloaded (8-124 bytes) and, swapped,
    without an activation or a residual: 12-56 bytes with no epilogue on layout NT (on NN 24-56 through TMA, 12 from
    registers in cluster pairs under ping-pong, none otherwise), 104-136 with a bias from registers, 16-40 with a bias
    through TMA under ping-pong. `check` refuses those (swapped with neither an activation nor a residual, it allows B
    stored K x N from registers, without a bias, and not ping-pong in pairs: cuBLAS's orientation of this tile on such
    products): tests/test_hopper_tall.py. With the bias along N staged in shared memory (HopperConfig.stages_bias), an
    activation's values preloaded compiled without spills (BF16 NT and FP16 TT, 1000 x 9000 x 2304, SiLU, GELU, the
    tanh GELU and ReLU, 3 and 4 stages, ping-pong or sharing the tile, in pairs or not): only the unstaged are refused."""
    row = dtypes.lookup(problem.dtype, problem.compute)
    for knob, on in (("split_k", config.split_k > 1), ("stream_k", config.stream_k), ("stmatrix", config.stmatrix)):
        if on:
            bad("tall", f"a consumer of {config.wm}x{config.wn} ({config.accumulators()} accumulators a thread) is "
                        f"written for the plain kernel: {knob}={getattr(config, knob)} does not go with it")
    epilogue = problem.epilogue
    if config.preload and epilogue.activation and not config.stages_bias(problem):
        bad("registers", f"a consumer of {config.wm}x{config.wn} spills registers with an activation's values "
                         f"preloaded ({epilogue.activation}, preload) unless its bias along N is staged")
    # (a residual through TMA's overlapping chunks beside a bias along N, in cluster pairs: 16-24 bytes on tails, BF16
    # NT and FP16 TT, 3 and 4 stages, ping-pong or not; alone, beside a bias along M, or not in pairs, none)
    if config.tma_store and config.cluster > 1 and epilogue.residual and epilogue.bias == "n":
        bad("registers", f"a consumer of {config.wm}x{config.wn} in cluster pairs spills registers with a residual and "
                         "a bias along N through the TMA store")
    # (NVRTC 13.5, sm_90a, which serves on a new install: SiLU's fast form beside a bias along N read from global
    # memory, through the TMA store under ping-pong in cluster pairs, 12 bytes spilled and 8 of stack, BF16 and FP16,
    # NT and TT, 3 and 4 stages, on tails and whole tiles; with GELU, the bias staged, along M or none, or any of the
    # four knobs off, none; swapped, where that bias is along the kernel's rows, none; nvcc 13.0 compiled these
    # without spills)
    if (config.cluster > 1 and config.tma_store and config.pingpong and config.fast_activation and not config.swap
            and epilogue.activation == "silu" and epilogue.bias == "n" and not config.stages_bias(problem)):
        bad("registers", f"a consumer of {config.wm}x{config.wn} in cluster pairs under ping-pong spills registers with "
                         "SiLU's fast form and a bias along N through the TMA store, unless the bias is staged")
    if config.swap and not (epilogue.activation or epilogue.residual) and (
            problem.trans_b or config.tma_store or epilogue.bias or (config.pingpong and config.cluster > 1)):
        bad("registers", f"a consumer of {config.wm}x{config.wn} swapped spills registers without an activation or a "
                         "residual, except with B stored K x N (layout NN), stored from registers, without a bias and "
                         "not ping-pong in cluster pairs")
    if row.scaled or not config.transposes(problem) or problem.grouped:
        bad("dtype", f"a consumer of {config.wm}x{config.wn} is written for 16-bit products, not "
                     f"{problem.dtype}/{problem.compute}{' grouped' if problem.grouped else ''}")


def layout_reasons(config: Any, problem: Problem, kernel: Problem, bad) -> None:
    """What the operands' layout asks: wgmma reads 32-bit types from shared memory K-major only (TF32's A
    stored K x M goes through registers, within the consumer's registers beside the accumulators); the
    transposed TMA store stages wm of C's rows at a time. `kernel` is the problem whose layout the kernel
    reads."""
    if not config.transposes(problem) and not kernel.trans_b:
        if problem.layout == "tn":
            bad("layout", f"wgmma reads {problem.dtype}/{problem.compute} from shared memory K-major only: layout TN "
                          f"has K contiguous in neither A nor B")
        else:
            bad("layout", f"wgmma reads {problem.dtype}/{problem.compute} from shared memory K-major only: layout "
                          f"{problem.layout.upper()} needs swap={not config.swap} (B's K is "
                          f"{'contiguous' if problem.trans_b else 'strided'})")
    elif config.accumulators() + config.fragment_registers(kernel) > MAX_ACCUMULATORS_AND_FRAGMENTS:
        bad("registers", f"{config.accumulators()} accumulators and {config.fragment_registers(kernel)} registers of "
                         f"A's fragments per consumer thread exceed {MAX_ACCUMULATORS_AND_FRAGMENTS}")
    # swapped, the TMA store's pieces are wm of C's rows (the kernel's columns); a bn no multiple of wm stores its last
    # wm columns overlapping the ones before (hopper_gemm.cu.j2's transposed_overlap): a residual's columns in common
    # would be read again after the group before had stored them, were it D itself, and stmatrix writes whole groups
    if config.swap and config.tma_store and config.bn % config.wm and (
            config.bn < config.wm or config.stmatrix or problem.epilogue.residual):
        bad("choice", f"the transposed TMA store (swap) stages {config.wm} of C's rows at a time: bn={config.bn} "
                      f"is no multiple of wm={config.wm}, and its last {config.wm} overlap the ones before only "
                      "without stmatrix or a residual, in a tile at least that wide")


def stream_k_reasons(config: Any, problem: Problem, device: Device, bad) -> None:
    """Stream-K shares K slices out over one persistent block per SM: no split of K besides it, no
    cluster (a pair's partner would need the same runs), no ping-pong (its consumers take whole tiles in
    turns), and all tiles' slices times the blocks within the kernel's 63-bit arithmetic."""
    for knob, on in (("split_k", config.split_k > 1), ("cluster", config.cluster > 1), ("pingpong", config.pingpong),
                     ("persistent", not config.persistent)):
        if on:
            bad("stream-k", f"stream_k shares K slices out over one persistent block per SM, alone: "
                            f"{knob}={getattr(config, knob)} does not go with it")
    if problem.grouped:
        bad("grouped", "stream_k: a grouped product's tiles are counted on the GPU, not shared out by the host's count")
    if config.bn % STREAM_K_BN_STEP:
        bad("fragment", f"stream_k adds a tile's accumulators up 8 or 16 at a time: bn={config.bn} must be a multiple of "
                        f"{STREAM_K_BN_STEP}")
    slices = config.stream_slices(config.kernel_problem(problem))
    if slices * max(1, device.sm_count) >= 2 ** 63:
        bad("grid", f"stream_k: {slices} K slices of all tiles times {device.sm_count} blocks exceed the kernel's "
                    "63-bit arithmetic")


def split_n_reasons(config: Any, problem: Problem, kernel: Problem, bad) -> None:
    """Two consumers that split the tile's columns (wm = bm, wn = bn / 2) share each stage's A and read their
    own half of B; each stores its columns from registers, or into the TMA store's chunks, which they share
    (a chunk's 64 columns may straddle the two halves). Written for the plain 16-bit kernel only, so far: no
    ping-pong (its consumers take whole tiles), no split of K (slots sized by a consumer's rows), no swap, no
    stmatrix or preload (written for a consumer's own chunks), no FP8 or TF32, no grouped product. B stored K x N
    (MN-major) is read in boxes of 64 columns: a consumer's half starts on one where wn is a multiple of 64.
    `kernel` is the problem the kernel computes."""
    for knob, on in (("pingpong", config.pingpong), ("split_k", config.split_k > 1), ("stream_k", config.stream_k),
                     ("swap", config.swap), ("stmatrix", config.stmatrix), ("preload", config.preload)):
        if on:
            bad("split-n", f"consumers that split N ({config.wm}x{config.wn} of {config.bm}x{config.bn}) share a "
                           f"tile and its store, unswapped: {knob}={getattr(config, knob)} does not go with them")
    row = dtypes.lookup(problem.dtype, problem.compute)
    if row.scaled or not config.transposes(problem):
        bad("dtype", f"consumers that split N are written for 16-bit products, not {problem.dtype}/{problem.compute}")
    if problem.grouped:
        bad("grouped", "consumers that split N: a grouped product's tiles are not written for them")
    step = SPLIT_N_WN_STEP if kernel.trans_b else SWIZZLE_BYTES // row.itemsize
    if config.wn % step:
        bad("fragment", f"a consumer's wn={config.wn} must be a multiple of {step} (split N: "
                        + ("wgmma's N and the store's pairs of columns)" if kernel.trans_b else
                           f"B stored K x N is read in boxes of {step} columns, and a consumer's half starts on one)"))


def stmatrix_reasons(config: Any, problem: Problem, bad) -> None:
    """stmatrix writes the TMA store's chunks: it needs that store, and C of a 16-bit type (the
    instruction's b16 matrices; FP8 products' D and FP32 C are written element by element)."""
    if not config.tma_store:
        bad("choice", "stmatrix writes the TMA store's chunks: it needs tma_store")
    row = dtypes.lookup(problem.dtype, problem.compute)
    if row.scaled or row.itemsize != 2:
        bad("dtype", f"stmatrix stores 16-bit matrices: C of {problem.dtype} products is written element by element")


def fast_activation_reasons(problem: Problem, bad) -> None:
    """fast_activation computes a GELU or SiLU epilogue by the epilogue pass's forms: GELU's erf by Abramowitz
    and Stegun's 7.1.26, the exponential and quotient by the hardware's (a few ulps of FP32, within the
    verification's bound). With two consumers sharing a tile, no wgmma runs while they apply the epilogue: on an
    H200 (FP16 1536 x 18176 x 4544) bias + SiLU made a 128 x 192 tile 29% slower than bare, 16% with these forms.
    A problem with another activation or none renders the same kernel with it as without: a duplicate the
    search need not measure."""
    if problem.epilogue.activation not in FAST_FORM_ACTIVATIONS:
        bad("choice", f"fast_activation changes only a {' or '.join(a.upper() for a in FAST_FORM_ACTIVATIONS)} epilogue; "
                      f"this problem's activation is {problem.epilogue.activation or 'none'}")


def preload_reasons(config: Any, problem: Problem, bad) -> None:
    """preload loads the values the epilogue reads (the bias along N once a chunk, along M and the residual once a
    row) before any of them is used, where the store otherwise loads each just ahead of its use and waits out its
    latency: into the TMA store's chunks, or from registers a row's values a group at a time (where each had waited
    for the store before it, since C may be the residual). It needs the consumers' own untransposed stores (not
    swap, not stmatrix), a bias or a residual to load, and a 16-bit or TF32 product (FP8's scales are read as
    before). A problem with neither renders the same kernel with it as without: a duplicate the search need not
    measure."""
    for knob, off in (("swap", config.swap), ("stmatrix", config.stmatrix)):
        if off:
            bad("choice", f"preload loads the epilogue's values for the consumers' own untransposed stores: "
                          f"{knob}={getattr(config, knob)} does not go with it")
    if dtypes.lookup(problem.dtype, problem.compute).scaled:
        bad("dtype", f"preload is written for 16-bit and TF32 products' epilogues, not {problem.dtype}'s scales")
    if not (problem.epilogue.bias or problem.epilogue.residual):
        bad("choice", f"preload loads a bias or a residual; this problem's epilogue has neither "
                      f"({problem.epilogue.key or 'none'})")
    # (ptxas, BF16 NT at 2048 x 13824 x 5120 and 6144 x 14336 x 4096: of the kernels with consumers of 128 rows
    # (256 x 64 and 256 x 128, ping-pong or sharing the tile, in pairs or not), preload, a residual and GELU or SiLU,
    # fast forms or not, fifteen of twenty-five spilled 4-96 bytes; with preload and no residual, or a residual and no
    # preload, none of those tried did; consumers of 64 rows none. Stored from registers: of twelve such 256 x 128
    # kernels, ping-pong or sharing the tile, FP16 and BF16, one spilled 16 bytes, ping-pong with the fast SiLU)
    if config.wm > ROWS_PER_INSTRUCTION and problem.epilogue.residual and problem.epilogue.activation:
        bad("registers", f"preload with consumers of {config.wm} rows, an activation and a residual spills registers "
                         f"({problem.epilogue.key})")


def hoisted_descriptors_reasons(problem: Problem, bad) -> None:
    """hoisted_descriptors is written for the main loop without block scales: FP8's block-scaled loops compute
    their descriptors as before, so it would change nothing there."""
    if problem.epilogue.scale == "block":
        bad("choice", "hoisted_descriptors is written for the main loop without block scales (FP8's block-scaled "
                      "loops compute their descriptors as before)")


def dependent_launch_reasons(problem: Problem, bad) -> None:
    """dependent_launch waits for the grid before it (griddepcontrol.wait) after the barriers' setup: a scaled
    product's tensor scales are read before that, at the kernel's entry (common.cuh.j2's epilogue_arguments)."""
    if dtypes.lookup(problem.dtype, problem.compute).scaled:
        bad("choice", "dependent_launch waits after the kernel's entry, where a scaled (FP8) product already reads "
                      "its scales: 16-bit and TF32 products only")


def cluster_n_reasons(config: Any, problem: Problem, bad) -> None:
    """Clusters along N (A's slices multicast to the row's blocks) are written for whole tiles of one block
    each: not with stream-K (a partner would need the same runs of K), consumers that split N (their columns'
    origin moves past the cluster's), a grouped product (one block a tile) or FP8 (its scales' copies not
    written for it)."""
    for knob, on in (("stream_k", config.stream_k), ("split N", config.split_n), ("grouped", problem.grouped),
                     ("FP8", dtypes.lookup(problem.dtype, problem.compute).scaled)):
        if on:
            bad("cluster", f"cluster_n={config.cluster_n} (A multicast along N) is written for whole tiles of one "
                           f"block each in 16-bit and TF32 products: not with {knob}")


def grouped_reasons(config: Any, problem: Problem, bad) -> None:
    """A grouped product's tiles start at its groups' offsets, read on the GPU: its rows are masked in the
    register store (the TMA store would write into the next group's rows), one block a tile (no cluster),
    no split of K, no swap, no epilogue yet, at most MAX_GROUPS groups (their tile counts sit in shared
    memory)."""
    for knob, on in (("tma_store", config.tma_store), ("cluster", config.cluster > 1), ("split_k", config.split_k > 1),
                     ("swap", config.swap)):
        if on:
            bad("grouped", f"{knob}: a grouped product's rows end at its groups' offsets, which only the "
                           "register store of one block a tile, unsplit and unswapped, masks")
    if not problem.epilogue.is_identity:
        bad("grouped", f"epilogue {problem.epilogue}: grouped kernels take no epilogue yet")
    if problem.batch > MAX_GROUPS:
        bad("grouped", f"{problem.batch} groups exceed the kernel's {MAX_GROUPS}")


def fp8_reasons(config: Any, problem: Problem, bad) -> None:
    """What an FP8 product asks of a config beyond the other types' rules: A K-major too (wgmma
    reads 8-bit A from shared memory only, K-major), K a multiple of 16 (TMA's 16-byte pitches:
    FP8 operands are not repacked), the TMA store of D not transposed (its chunks are D's rows), no
    swap of row or block scales (they would change roles), and for block scales a slice of one block
    of K, a tile within two blocks of B's columns, and the registers for a set of partial sums."""
    kernel_a_transposed = not problem.trans_b if config.swap else problem.trans_a  # (swap: B is the kernel's A)
    if kernel_a_transposed:
        bad("layout", f"wgmma reads {problem.dtype} K-major only: layout {problem.layout.upper()} stores "
                      f"{'B as K x N' if config.swap else 'A as K x M'}; FP8 needs A stored M x K and B N x K (NT)")
    if problem.k % TMA_ALIGN_BYTES:
        bad("layout", f"K={problem.k}: FP8 operands need K a multiple of {TMA_ALIGN_BYTES} (TMA's 16-byte pitches)")
    if config.tma_store and config.swap:
        bad("choice", "tma_store with swap: FP8 kernels store D through TMA in the plain layout only (chunks of "
                      "D's rows), not transposed")
    if config.swap and problem.epilogue.scale in ("row", "block"):
        bad("choice", f"swap: {problem.epilogue.scale} scales would change roles (scale_a runs along M, scale_b "
                      "along N)")
    if problem.epilogue.scale == "block":
        # each slice's partial sums are promoted with its scales: a slice is one block of K, a tile's
        # columns lie in two blocks of B at most, and the partial sums need registers beside the accumulators
        if config.bk != BLOCK or config.bn > MAX_BLOCK_SCALED_BN:
            bad("fragment", f"block scales take bk={BLOCK} (one block of K a slice) and bn of at most "
                            f"{MAX_BLOCK_SCALED_BN} (a tile's columns in two blocks of B at most); got "
                            f"bk={config.bk}, bn={config.bn}")
        elif config.block_scaled_sets() == 0:
            bad("registers", f"block scales keep a slice's partial sums beside the accumulators: 2 x "
                             f"{config.accumulators()} per consumer thread exceed {MAX_BLOCK_SCALED_VALUES}")


def switched_knob_reasons(config: Any, problem: Problem, device: Device, bad) -> None:
    """The reasons of each knob that is on (stream-K, stmatrix, the fast activations, preload, hoisted
    descriptors, a cluster along N, dependent launch), in that order."""
    if config.stream_k:
        stream_k_reasons(config, problem, device, bad)
    if config.stmatrix:
        stmatrix_reasons(config, problem, bad)
    if config.fast_activation:
        fast_activation_reasons(problem, bad)
    if config.preload:
        preload_reasons(config, problem, bad)
    if config.hoisted_descriptors:
        hoisted_descriptors_reasons(problem, bad)
    if config.cluster_n > 1:
        cluster_n_reasons(config, problem, bad)
    if config.dependent_launch:
        dependent_launch_reasons(problem, bad)
