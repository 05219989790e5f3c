"""How a family's kernel is launched: the kinds of launch autogemm knows, each with its own grid
and arguments in `gpu.kind_launch` (its table `LAUNCHES`). A config names its kind (`GemmConfig.launch_kind`); the
values are strings, so that a kind compares equal to its name (records, tests, a family from
outside the package that spells it as a string)."""

from __future__ import annotations

import enum


class LaunchKind(enum.StrEnum):
    # a block per output tile, batch and K split; with split-K, a reduction kernel adds the splits up
    TILES = "tiles"
    # the same grid, the last block of each tile adding its splits up (partial sums in a workspace)
    SPLIT_K_FUSED = "split_k_fused"
    # the same grid, a tile's splits one thread-block cluster adding up in distributed shared memory
    SPLIT_K_CLUSTER = "split_k_cluster"
    # a persistent grid dealing out (tile, K slice) iterations, with a partial-sum workspace
    STREAM_K = "stream_k"
    # a block per tile or a persistent grid of clusters, A, B (and C) passed as TMA tensor maps
    TMA = "tma"
