"""How a configuration's work fills the GPU: its work units (output tiles times K splits) dealt to the
SMs in waves, and a rough cost that ranks the configurations of one problem by it.

Wave quantization is most of why a Hopper tile loses to cuBLAS on a shape: with 128 x 256 tiles a
640 x 4096 product has 80 tiles for 132 SMs (61% of one wave) and a 256 x 4096 one 32 (24%), while
cuBLAS picks 128 x 192, 64 x 128 or split-K there (docs/tuning.md, "Waves"). `fill` counts
units / (waves x slots); `relative_cost` adds what a smaller tile or a split costs in data moved, so
that the tuner can seed its search with the tiles that fill the machine (tuning/wave_seeds.py) and the
tune's table can show the winner's count. DeepGEMM picks its block sizes by such a score.

The cost is in units of one SM's tensor-core work (2 flops a multiply-add), with data movement
converted at fixed exchange rates of an H100/H200-class SM. It only ranks: it predicts no time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import dtypes
from ..problem import Device, Problem
from .stream_k import ShareOut, share_out

# Tensor-core flops an SM issues per byte it reads from L2 (dense 16-bit: ~4096 flops a clock, against
# the ~64 bytes a clock per SM that L2 sustains to all SMs at once): a tile whose flops per loaded byte
# fall below this waits on L2 (128 x 160 and larger do not; 64 x 128 does, at two thirds of the rate).
# FP32 accumulators, so a product in any input type is counted in its own bytes. Calibrated on an H200's
# 640 x 4096 x 4096 BF16 (short timings): pairs of blocks multicasting B did not run faster than single
# blocks there, so L2 did not bind 128 x 160 or 128 x 192.
FLOPS_PER_L2_BYTE = 64.0
# what a work unit costs besides its main loop, in flops of the SM's time: the first slices' latency
# and the epilogue not hidden under the next tile (~2000 clocks)
UNIT_OVERHEAD_FLOPS = 8e6
# flops per byte of device memory, the whole GPU's ratio (~990 TFLOP/s dense 16-bit to ~4.8 TB/s):
# the output's store and split-K's FP32 partial sums are counted at this rate
FLOPS_PER_DRAM_BYTE = 200.0
# a single consumer warpgroup issues wgmmas with no other to cover its waits and its epilogue (so do
# ping-pong consumers of 64-row tiles, one main loop at a time: on an H200 at 640 x 4096 x 4096 ping-pong
# 64 x 160 tiles ran at 0.65x cuBLAS where 128 x 160 ran at 0.87x). Ping-pong consumers of 128-row tiles
# issue two wgmma row blocks a slice and keep the rate: on an H200 at 1536 x 18176 x 4544 FP16 ping-pong
# 128 x 128 tiles ran 404 us where cooperative 128 x 192 ones ran 418.
ONE_CONSUMER_RATE = 0.85
# the share of a unit's store that its SM waits for where the TMA store or the other ping-pong consumer
# hides it under the next tile's main loop
HIDDEN_STORE = 0.3
# What a fused epilogue costs a unit's store, per output element, in flops of the SM's time: the consumers
# compute it in registers before the store, and no TMA store hides that; the other ping-pong consumer's
# main loop hides most of it. Measured on an H200 at 1536 x 18176 x 4544 FP16 (session 46, sustained):
# cooperative 128 x 192 tiles paid 32 us for a bias, 67 with a fast-form SiLU, 100 with a fast-form GELU and
# 115-122 with the accurate forms, over 418; ping-pong 128 x 128 ones 17, 25, 47 and 55-58 over 404. With the
# bias loaded ahead (session 60, each tile timed as a plain GEMM too): at BF16 4096 x 13824 x 5120 the
# cooperative 128 x 192 tile paid 43 us for a bias and 115 with fast SiLU over 889, ping-pong 7 and 12 over 899;
# at FP16 2048 x 13824 x 5120 with fast GELU 71 against 28; at BF16 2048 x 9216 x 2304 (a short main loop to
# hide it under) 38 against 25. PINGPONG_HIDDEN_EPILOGUE is the share ping-pong pays, from the middle of those.
EPILOGUE_FLOPS = {"bias": 700.0, "residual": 700.0, "activation": 1900.0}
FAST_ACTIVATION_FLOPS = {"silu": 750.0, "gelu": 1500.0}  # with the Hopper family's fast_activation
PINGPONG_HIDDEN_EPILOGUE = 0.3  # the share of that a ping-pong SM waits for
# The share of a bias's and a residual's cost left where the Hopper family's `preload` loads them ahead of the
# chunk's epilogue. Measured on an H200 (session 60, sustained, BF16): at 6144 x 4672 x 4544 with a bias along N,
# 128 x 256 tiles ran 452 us without and 433 with, ping-pong 256 x 128 ones 424 and 408 (F.linear alone: 396);
# with bias + GELU at 6144 x 13824 x 5120, 128 x 256 tiles ran 1616 and 1456.
PRELOADED_LOADS = 0.4
PARTIAL_BYTES = 4  # a split-K partial sum (FP32)


@dataclass(frozen=True)
class Waves:
    """A configuration's work on a device: `units` work units (tiles x K splits x batch) over
    `slots` places that run one at a time each (the SMs)."""

    units: int
    slots: int
    tile: tuple[int, int]  # rows x columns of a work tile, in the kernel's terms
    split_k: int
    k_slices: int = 0  # with stream-K: a tile's K slices (0: no stream-K)

    @property
    def stream_k(self) -> bool:
        return self.k_slices > 0

    @property
    def share_out(self) -> ShareOut | None:
        """With stream-K, how the SMs share the tiles out (families/stream_k.py)."""
        return share_out(self.units, self.k_slices, self.slots) if self.stream_k else None

    @property
    def whole_tiles(self) -> int:
        """The tiles an SM runs whole: all of them, or with stream-K those of its whole waves but a last
        wave less than half full takes the one before along (families/stream_k.py)."""
        plan = self.share_out
        return plan.whole if plan else self.units

    @property
    def waves(self) -> float:
        """Waves of tiles, whole ones; with stream-K, in tiles' time: whole waves plus the longest run of
        the shared slices."""
        if self.whole_tiles == self.units:
            return -(-self.units // self.slots)
        shared = (self.units - self.whole_tiles) * self.k_slices
        return self.whole_tiles // self.slots + -(-shared // self.slots) / self.k_slices

    @property
    def shares_per_tile(self) -> int:
        """With stream-K, the runs a shared tile's slices typically lie in (0: none shared)."""
        plan = self.share_out
        return plan.typical_shares if plan else 0

    @property
    def shared_tiles(self) -> int:
        """With stream-K, the tiles whose K slices several SMs share."""
        return self.units - self.whole_tiles

    @property
    def efficiency(self) -> float:
        """units / (waves x slots): 1.0 where every wave is full."""
        return self.units / (self.waves * self.slots)

    def describe(self) -> str:
        """As the tune's table shows it: '80 tiles of 128x256, 1 wave, 61% full', or with stream-K
        '108 tiles of 128x128, stream-K: 108 shared by the SMs, 100% full'."""
        rows, cols = self.tile
        if self.shared_tiles:
            whole = f"{self.whole_tiles} whole, " if self.whole_tiles else ""
            return (f"{self.units} tiles of {rows}x{cols}, stream-K: {whole}{self.shared_tiles} shared by the SMs, "
                    f"{self.efficiency:.0%} full")
        split = f" x {self.split_k} splits" if self.split_k > 1 else ""
        waves = f"{self.waves} wave{'s' if self.waves != 1 else ''}"
        return f"{self.units // self.split_k} tiles of {rows}x{cols}{split}, {waves}, {self.efficiency:.0%} full"


def _tile(config: Any) -> tuple[int, int]:
    """Rows x columns of one work tile: a ping-pong consumer's (the Hopper family's tile_rows), else the block's."""
    return getattr(config, "tile_rows", config.bm), config.bn


def fill(config: Any, problem: Problem, device: Device) -> Waves:
    """How `config`'s work units fill `device` on `problem` (in the kernel's terms: a config that
    swaps the operands' roles tiles the swapped problem)."""
    kernel = config.kernel_problem(problem)
    rows, cols = _tile(config)
    split = config.split_k
    # a cluster's blocks take adjacent tiles: a partner past the last row or column tile still runs
    cluster, cluster_n = getattr(config, "cluster", 1), getattr(config, "cluster_n", 1)  # (the Hopper family's)
    units = (-(-kernel.m // rows // cluster) * cluster * -(-kernel.n // cols // cluster_n) * cluster_n
             * kernel.batch * split)
    # (ping-pong: the two consumers of an SM take wm-row tiles in turns, one's main loop at a time, so an SM
    # is still one place; what it gains is its store under the other's main loop)
    k_slices = config.tiles_k(kernel) if getattr(config, "stream_k", False) else 0
    return Waves(units=units, slots=max(1, device.sm_count), tile=(rows, cols), split_k=split, k_slices=k_slices)


def work_shape(config: Any, problem: Problem, device: Device) -> tuple[Any, ...]:
    """What tells configurations' work apart on `problem`: the tile, the K splits, the units (swapped roles
    count as another shape only where they tile the product differently) and ping-pong. The knobs besides
    (stages, group_m, a cluster whose tiles pair up, the store) change how fast a unit runs, not how the work
    is dealt out."""
    waves = fill(config, problem, device)
    return waves.tile, waves.split_k, waves.units, bool(getattr(config, "pingpong", False))


def relative_cost(config: Any, problem: Problem, device: Device) -> float:
    """A rough cost of `config` on `problem` (lower is faster; comparable between the configs of one
    problem only): the waves times what one work unit costs an SM. A unit multiplies its tile over
    its share of K (padded to whole slices), loading both operands' slices from L2 (multicast: B once per
    column of a cluster's tiles, A once per row), then stores its tile, and with split-K writes and reads
    back FP32 partial sums."""
    waves = fill(config, problem, device)
    rows, cols = waves.tile
    itemsize = dtypes.lookup(problem.dtype, problem.compute).itemsize
    k_share = -(-math.ceil(problem.k / waves.split_k) // config.bk) * config.bk  # (K is K whichever operand is first)
    compute = 2.0 * rows * cols * k_share
    cluster, cluster_n = getattr(config, "cluster", 1), getattr(config, "cluster_n", 1)  # (the Hopper family's)
    loaded = (rows / cluster_n + cols / cluster) * k_share * itemsize
    main_loop = max(compute, loaded * FLOPS_PER_L2_BYTE)
    pingpong = getattr(config, "pingpong", False)
    one_consumer = getattr(config, "consumers", 2) == 1 or (pingpong and rows < 128)
    rate = ONE_CONSUMER_RATE if one_consumer else 1.0  # (one warpgroup's wgmmas at a time)
    out_itemsize = 4 if itemsize == 4 else 2
    hidden = getattr(config, "tma_store", False) or pingpong
    store = rows * cols * out_itemsize * FLOPS_PER_DRAM_BYTE * (HIDDEN_STORE if hidden else 1.0)
    store += rows * cols * epilogue_flops(config, problem) * (PINGPONG_HIDDEN_EPILOGUE if pingpong else 1.0)
    unit = (main_loop + UNIT_OVERHEAD_FLOPS) / rate + store
    if waves.split_k > 1:  # each unit writes its partial sums; the last reads every split's back
        unit += 2 * rows * cols * PARTIAL_BYTES * FLOPS_PER_DRAM_BYTE
    if waves.shared_tiles:
        # after the whole waves, an SM's run of shared slices: its share of the main loops, up to two
        # segments' start, the two partial sums its run begins and ends in written, and the slots of a
        # tile read back by the SM that finishes it (one SM's loads one after the other: at memory's rate)
        shared_run = waves.waves - waves.whole_tiles // waves.slots
        partials = (2 + waves.shares_per_tile) * rows * cols * PARTIAL_BYTES * FLOPS_PER_DRAM_BYTE
        return (waves.whole_tiles // waves.slots * unit + (shared_run * main_loop + 2 * UNIT_OVERHEAD_FLOPS) / rate
                + store + partials)
    return waves.waves * unit


def epilogue_flops(config: Any, problem: Problem) -> float:
    """What `problem`'s fused epilogue costs `config`'s store per output element, in flops of an SM's time
    (EPILOGUE_FLOPS; 0 without one; an FP8 product's scaling is not counted: every
    config pays it alike). A gated epilogue's two halves are counted as one element's."""
    epilogue = problem.epilogue
    cost = EPILOGUE_FLOPS["bias"] if epilogue.bias else 0.0
    cost += EPILOGUE_FLOPS["residual"] if epilogue.residual else 0.0
    cost *= PRELOADED_LOADS if getattr(config, "preload", False) else 1.0
    if epilogue.activation:
        fast = getattr(config, "fast_activation", False) and epilogue.activation in FAST_ACTIVATION_FLOPS
        cost += FAST_ACTIVATION_FLOPS[epilogue.activation] if fast else EPILOGUE_FLOPS["activation"]
    return cost
