"""How a stream-K Hopper kernel shares its tiles out among its blocks (templates/hopper_gemm.cu.j2,
STREAM_K: `share_out` there computes the same): which tiles the blocks take whole, which they share,
in what order the shared tiles' K slices lie, and how many blocks' partial sums a shared tile may have.
The launcher sizes the workspace by it (HopperConfig.split_workspace) and the wave model counts by it
(waves.Waves).

The blocks (G, one per SM) take whole tiles a wave at a time. The tiles of a last, partly empty wave
are shared: their K slices are laid in one order and cut into G equal runs, one a block. Two choices
aim to keep that cheap:

- A last wave less than half full takes the whole wave before it along (CUTLASS's "two-tile" stream-K
  rule): each block's run is then more than a tile long, so a shared tile is added up from at most
  three blocks' partial sums, not from as many as G / tiles.
- Fewer shared tiles than blocks (a single, partly empty wave): the order is "prefixes first".
  Block t < tiles runs the first slices of tile t, the other blocks the tiles' remaining slices one
  tile after the other. The prefix blocks then step through K side by side, as whole tiles do, and
  read the operands' slices that several tiles share from L2 once; in tile-after-tile order all the
  blocks are spread over K at once. Where the blocks beyond the tiles are too few to take the rest
  (fewer than one per PREFIX_TAILS_PER_BLOCK tiles), each would write many small partial sums: the
  tile-after-tile order is kept then.

On an H200 this is still slower than the plain tiles (docs/kernels.md has the figures): the blocks that
run the rests read slices no other SM reads at that time, one SM's loads after the other, and finish
last. The search space does not offer the knob.
"""

from __future__ import annotations

from dataclasses import dataclass

# the most shared tiles one block after the prefix blocks takes the rest of, in the prefixes-first order
PREFIX_TAILS_PER_BLOCK = 8


@dataclass(frozen=True)
class ShareOut:
    """A stream-K launch's share-out of `units` tiles of `k_tiles` K slices among `blocks` blocks."""

    units: int
    k_tiles: int
    blocks: int
    whole: int  # tiles taken whole, the first ones
    tiles: int  # tiles shared after them
    prefixes: bool  # the shared slices' order: prefixes first (else tile after tile)

    @property
    def slices(self) -> int:
        return self.tiles * self.k_tiles

    def run_begin(self, block: int) -> int:
        """Block `block`'s first shared slice (`blocks`: the end)."""
        return self.slices * block // self.blocks

    @property
    def typical_shares(self) -> int:
        """The runs a shared tile's slices typically lie in: its K over the shortest run (slices // blocks,
        at least one slice) and one more (0: nothing shared)."""
        if not self.tiles:
            return 0
        return -(-self.k_tiles // (self.slices // self.blocks)) + 1

    @property
    def most_shares(self) -> int:
        """A bound on the blocks whose runs one shared tile's slices lie in (its workspace slots): the
        typical count, and one more for a prefix's run (the kernel's share_out computes the same)."""
        return self.typical_shares + 1 if self.tiles else 0


def share_out(units: int, k_tiles: int, blocks: int) -> ShareOut:
    """The kernel's share-out (see the module's docstring)."""
    whole = units // blocks * blocks
    tiles = units - whole
    if tiles and whole and 2 * tiles < blocks:  # (the two-tile rule)
        whole, tiles = whole - blocks, tiles + blocks
    if tiles * k_tiles < blocks:  # fewer slices than blocks: nothing is shared
        whole, tiles = units, 0
    prefixes = 0 < tiles < blocks and tiles <= PREFIX_TAILS_PER_BLOCK * (blocks - tiles)
    return ShareOut(units=units, k_tiles=k_tiles, blocks=blocks, whole=whole, tiles=tiles, prefixes=prefixes)
