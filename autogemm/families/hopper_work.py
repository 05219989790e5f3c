"""The Hopper family's work on a launch (HopperConfig takes it from HopperWork): the units its blocks and
clusters take, the K slices stream-K shares out, the workspace where split-K's and stream-K's partial sums are
added up, and the grid. Apart from hopper.py, which holds the knobs, the checks and the template's context."""

from __future__ import annotations

from ..problem import Device, Problem
from .stream_k import share_out

ACCUMULATOR_BYTES, COUNTER_BYTES = 4, 4  # a split-K partial sum (FP32) and a share's counter (int)


class HopperWork:
    """The work of a config with the Hopper family's knobs (tile_rows, bn, cluster, cluster_n, split_k, stream_k,
    pingpong, persistent; consumers and tiles_k): a mixin of HopperConfig's."""

    @property
    def cluster_blocks(self) -> int:
        """Blocks per cluster: `cluster` along M times `cluster_n` along N."""
        return self.cluster * self.cluster_n

    def work_units(self, problem: Problem) -> int:
        """What the blocks of a cluster take together: `cluster` vertically adjacent tiles (the last
        column's may reach past M), times `cluster_n` horizontally adjacent ones (the last row's may
        reach past N), per batch and K split. (With `stream_k` a tile, which the blocks' runs of K
        slices may share.)"""
        return self._tile_columns(problem) * self.split_k

    def stream_slices(self, problem: Problem) -> int:
        """With `stream_k`, the K slices of all tiles that the blocks share out (`problem` the kernel's)."""
        return self.work_units(problem) * self.tiles_k(problem)

    @property
    def reduces_partial_sums(self) -> bool:
        """Whether blocks leave partial sums of a tile to be added up (split-K or stream-K): the kernel
        then takes a workspace (`split_workspace`) and a flag per consumer in shared memory."""
        return self.split_k > 1 or self.stream_k

    def _tile_columns(self, problem: Problem) -> int:
        """The clusters' tiles over the output (`cluster` x `cluster_n` adjacent tiles), per batch."""
        tiles_m, tiles_n = -(-problem.m // self.tile_rows), -(-problem.n // self.bn)
        if problem.grouped:  # (at most: each group's last row tile may be partial, one more per group)
            return (tiles_m + problem.batch) * tiles_n
        return -(-tiles_m // self.cluster) * -(-tiles_n // self.cluster_n) * problem.batch

    def split_workspace(self, problem: Problem, blocks: int | None = None) -> tuple[int, int]:
        """Bytes of the split-K workspace (`problem` the kernel's, `blocks` the launch's, which stream-K
        needs): per work tile (of tile_rows x bn) a slot of FP32 partial sums per split, or with
        `stream_k` per shared tile one per run its slices may lie in (stream_k.ShareOut.most_shares),
        and per consumer's share of a work tile an int counter (zero at launch, and left zero by the
        unit that counts last). (0, 0) where nothing is added up."""
        if not self.reduces_partial_sums:
            return 0, 0
        if self.stream_k and blocks is None:
            raise ValueError(f"{self.name}: a stream-K workspace is sized by the launch's blocks")
        work_tiles = self._tile_columns(problem) * self.cluster_blocks
        shares = 1 if self.pingpong else self.consumers
        if self.stream_k:
            plan = share_out(self.work_units(problem), self.tiles_k(problem), blocks)
            slots = max(1, plan.tiles * plan.most_shares)  # (at least one: a launch that shares nothing)
        else:
            slots = work_tiles * self.split_k
        return slots * self.tile_rows * self.bn * ACCUMULATOR_BYTES, work_tiles * shares * COUNTER_BYTES

    def grid_blocks(self, problem: Problem, device: Device, resident_clusters: int | None = None) -> int:
        """Blocks of the launch: a cluster per work unit, or with `persistent` at most as many
        clusters as are resident at once (`resident_clusters`, the driver's figure; without it one
        block per SM). A persistent grid larger than that would leave clusters to a second wave."""
        units = self.stream_slices(problem) if self.stream_k else self.work_units(problem)
        if self.persistent:
            resident = resident_clusters if resident_clusters is not None else device.sm_count // self.cluster_blocks
            units = max(1, min(units, resident))
        return units * self.cluster_blocks
