"""The Hopper family's knobs (families/hopper.py says what each does in the kernel; search_spaces/hopper.toml
and hopper_fp8.toml which values a tune draws): the tile, the ring's stages, the grid, clusters, the store, and
the kernel's optional paths, each with its code in a configuration's name."""

from __future__ import annotations

import dataclasses

from .base import grid_knobs, swap_knob, tile_knobs
from .knobs import Knob

CLUSTER_SIZES = (1, 2)
MIN_STAGES, MAX_STAGES = 2, 8

KNOBS = (
    # wm x wn: one consumer warpgroup's tile (wn = bn: a consumer spans the tile's columns; or wm = bm,
    # wn = bn / 2: two consumers split them)
    # (bn, wn: any multiple of the kernel's 64-column step, not only powers of two: 192 is the widest
    # block-scaled tile, with one set of partial sums; 320 is two wgmmas a consumer; `check` says which)
    *(dataclasses.replace(knob, power_of_two=False) if knob.name in ("bm", "bn", "wm", "wn") else knob
      for knob in tile_knobs(128, 256, 64, 64, 256)),
    Knob("stages", int, 4, code="s", low=MIN_STAGES, high=MAX_STAGES),
    *grid_knobs(),
    Knob("persistent", bool, True, omitted=False, words={True: "p"}),
    Knob("cluster", int, 1, code="c", choices=CLUSTER_SIZES, omitted=1,
         why="blocks of a cluster sharing B's slices by multicast; 1: no cluster"),
    Knob("cluster_n", int, 1, code="cn", choices=CLUSTER_SIZES, omitted=1,
         why="blocks of a cluster along N sharing A's slices by multicast; 1: none"),
    Knob("tma_store", bool, False, omitted=False, words={True: "ts"}),
    Knob("pingpong", bool, False, omitted=False, words={True: "pp"}),
    swap_knob(),  # TF32 with B stored K x N needs it
    Knob("stream_k", bool, False, omitted=False, words={True: "sk"},
         why="the grid's blocks share out all tiles' K slices in equal runs (a last wave partly empty)"),
    Knob("stmatrix", bool, False, omitted=False, words={True: "stm"},
         why="the TMA store's chunks written with stmatrix, four 8 x 8 matrices an instruction"),
    Knob("fast_activation", bool, False, omitted=False, words={True: "fa"},
         why="a GELU or SiLU epilogue by the epilogue pass's forms (hopper_rules.fast_activation_reasons)"),
    Knob("preload", bool, False, omitted=False, words={True: "pl"},
         why="the epilogue's bias and residual loaded before their use: a TMA-stored chunk's at a time, or from "
             "registers a row's group of pairs (hopper_rules.preload_reasons)"),
    Knob("hoisted_descriptors", bool, False, omitted=False, words={True: "hd"},
         why="a slice's two shared-memory descriptors computed once, each wgmma's theirs plus a constant"),
    Knob("dependent_launch", bool, False, omitted=False, words={True: "dl"},
         why="programmatic dependent launch: the next call's blocks start as this call's retire, and wait "
             "(griddepcontrol.wait) before touching memory"),
)
