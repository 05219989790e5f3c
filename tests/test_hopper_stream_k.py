"""Stream-K in the Hopper family (`stream_k`, templates/hopper_gemm.cu.j2 STREAM_K): what the config
allows, the grid and workspace the launcher makes for it, how it fills the SMs, that its kernels compile
without spills, and the kernel's share-out arithmetic replayed in Python: every K slice of every tile run
exactly once, and the slots of a shared tile's blocks distinct. CPU only; tests/test_gpu_kernels.py runs
the kernels against float64."""

from __future__ import annotations

import dataclasses
import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.families.stream_k import share_out
from autogemm.families.waves import fill, relative_cost
from autogemm.kernels.ptxas_report import nvrtc_resources
from autogemm.kernels.render import render
from autogemm.problem import Device, Problem

H200 = dataclasses.replace(Device.for_arch("sm_90"), name="NVIDIA H200", sm_count=132)
STREAM = "hopper_128x128x64_w64x128_s5_g8_k1_o1_p_ts_sk"


def _share_out(units: int, k_tiles: int, blocks: int):
    """The kernel's share-out, replayed as templates/hopper_gemm.cu.j2 computes it (share_out, StreamShare,
    next_segment and the fix-up): per block its segments (tile, kt_begin, k_slices, slot), slot None for a
    tile it runs whole; per shared tile the number of runs its slices lie in, as the fix-up counts them;
    and the kernel's bound on that (the slots a tile has)."""
    whole = units // blocks * blocks
    tiles = units - whole
    if tiles and whole and 2 * tiles < blocks:
        whole, tiles = whole - blocks, tiles + blocks
    if tiles * k_tiles < blocks:
        whole, tiles = units, 0
    slices = tiles * k_tiles
    prefixes = 0 < tiles < blocks and tiles <= 8 * (blocks - tiles)
    most = 2 + -(-k_tiles // (slices // blocks)) if tiles else 0

    def run_begin(block):
        return slices * block // blocks

    def block_of(at):
        return ((at + 1) * blocks - 1) // slices

    def rest_begin(tile):
        return tile * k_tiles - run_begin(tile)

    def piece(at):
        if not prefixes:
            return at // k_tiles, at % k_tiles, (at // k_tiles + 1) * k_tiles
        if at < run_begin(tiles):
            tile = block_of(at)
            return tile, at - run_begin(tile), run_begin(tile + 1)
        rest = at - run_begin(tiles)
        low, high = 0, tiles - 1
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if rest_begin(middle) <= rest else (low, middle - 1)
        kt = run_begin(low + 1) - run_begin(low) + rest - rest_begin(low)
        return low, kt, at + k_tiles - kt

    def shares_of(tile, block):
        if not prefixes:
            first = block_of(tile * k_tiles)
            return block - first, block_of((tile + 1) * k_tiles - 1) - first + 1
        rest, rest_end = run_begin(tiles) + rest_begin(tile), run_begin(tiles) + rest_begin(tile + 1)
        first = block_of(rest) if rest < rest_end else 0
        count = 1 + (block_of(rest_end - 1) - first + 1 if rest < rest_end else 0)
        return (0 if block == tile else 1 + block - first), count

    segments, counts = {}, {}
    for w in range(blocks):
        done = [(tile, 0, k_tiles, None) for tile in range(w, whole, blocks)]
        at, end_of_run = run_begin(w), run_begin(w + 1)
        while at < end_of_run:
            tile, kt_begin, end = piece(at)
            k_slices = min(end_of_run, end) - at
            at += k_slices
            slot = None
            if k_slices < k_tiles:
                slot, count = shares_of(tile, w)
                assert counts.setdefault(whole + tile, count) == count, "blocks count a tile's runs differently"
            done.append((whole + tile, kt_begin, k_slices, slot))
        segments[w] = done
    return segments, counts, most, (whole, tiles, prefixes, most)


@pytest.mark.parametrize("units, k_tiles, blocks", [
    (108, 284, 132), (36, 144, 132), (18, 144, 132), (216, 9, 132), (288, 47, 132), (2048, 128, 132), (4096, 128, 132),
    (1, 1, 1), (3, 1, 132), (133, 2, 132), (131, 300, 132), (120, 10, 132), (131, 10, 132), (7, 5, 3), (200, 3, 132),
    (150, 7, 132), (66, 2, 132)])
def test_the_share_out_runs_every_slice_once_and_a_shared_tiles_slots_are_its_runs(units, k_tiles, blocks):
    blocks = min(blocks, units * k_tiles)  # (the launch: HopperConfig.grid_blocks)
    segments, counts, most, kernel = _share_out(units, k_tiles, blocks)
    ran = [tile * k_tiles + kt for done in segments.values() for tile, begin, count, _ in done
           for kt in range(begin, begin + count)]
    assert sorted(ran) == list(range(units * k_tiles))
    assert all(done for done in segments.values()), "a block with nothing to do"
    written = {}
    for w, done in segments.items():
        for tile, _, count, slot in done:
            if slot is not None:
                assert slot not in written.setdefault(tile, {}).values(), (tile, w, slot)
                written[tile][w] = slot
    # a shared tile's slots are 0 .. count - 1, one per run its slices lie in, within the kernel's bound
    assert {tile: sorted(slots.values()) for tile, slots in written.items()} == \
        {tile: list(range(count)) for tile, count in counts.items()}
    assert all(count <= most for count in counts.values())
    # the host's copy of the arithmetic (workspace and wave model) agrees with the kernel's
    plan = share_out(units, k_tiles, blocks)
    assert (plan.whole, plan.tiles, plan.prefixes, plan.most_shares) == kernel


def test_stream_k_shares_a_partly_empty_wave_prefixes_first_and_keeps_fan_in_small():
    """The order that keeps the blocks side by side in K where one wave is partly empty, and the two-tile
    rule that keeps a tile's runs few where the last wave is nearly empty."""
    segments, counts, _, _ = _share_out(108, 284, 132)  # 333 x 4544 x 18176 in 128 x 128 tiles
    for w in range(108):  # block t runs the first slices of tile t
        assert segments[w] == [(w, 0, segments[w][0][2], 0)] and segments[w][0][2] in (232, 233)
    assert max(counts.values()) <= 3
    _, counts, _, _ = _share_out(288, 47, 132)  # 3000^3 in 128 x 256 tiles: 2 waves and 24 tiles
    plan = share_out(288, 47, 132)
    assert (plan.whole, plan.tiles, plan.prefixes) == (132, 156, False) and max(counts.values()) <= 3


def test_a_stream_k_config_names_renders_and_refuses_what_it_does_not_go_with():
    config = config_from_name(STREAM)
    assert config.stream_k and config.name == STREAM and config.reduces_partial_sums
    problem = Problem.from_layout(333, 4544, 18176, "nn", dtype="float16")
    assert config.check(problem, H200) == []
    source = render(config, problem).code
    assert "STREAM_K:" in source and "next_segment" in source
    assert "next_segment" not in render(config_from_name(STREAM[:-3]), problem).code
    for other in ("hopper_128x128x64_w64x128_s5_g8_k2_o1_p_ts_sk", "hopper_128x128x64_w64x128_s5_g8_k1_o1_p_c2_ts_sk",
                  "hopper_256x128x64_w128x128_s4_g8_k1_o1_p_ts_pp_sk", "hopper_128x128x64_w64x128_s5_g8_k1_o1_ts_sk"):
        reasons = config_from_name(other).check(problem, H200)
        assert any(r.startswith("stream-k") for r in reasons), (other, reasons)
    grouped = Problem(1024, 4096, 2048, dtype="bfloat16", trans_b=True, batch=8, grouped=True)
    assert any(r.startswith("grouped") and "stream_k" in r for r in config.check(grouped, H200))


def test_the_grid_is_a_block_per_sm_and_the_workspace_a_slot_per_run_of_a_shared_tile():
    config = config_from_name(STREAM)
    problem = Problem.from_layout(333, 4544, 18176, "nn", dtype="float16")
    kernel = config.kernel_problem(problem)
    assert config.grid_blocks(kernel, H200) == 132
    partial_bytes, counter_bytes = config.split_workspace(kernel, blocks=132)
    assert partial_bytes == 108 * 4 * 128 * 128 * 4  # 108 shared tiles, in at most 4 runs each
    assert counter_bytes == 3 * 36 * 2 * 4  # a counter per tile and consumer
    tiny = Problem.from_layout(64, 64, 64, "nt", dtype="float16")  # one tile of one slice: one block
    assert config.grid_blocks(config.kernel_problem(tiny), H200) == 1
    plain = config_from_name(STREAM[:-3])
    assert plain.split_workspace(kernel, blocks=132) == (0, 0)


def test_stream_k_fills_the_last_wave_that_whole_tiles_leave_partly_empty():
    problem = Problem.from_layout(333, 4544, 18176, "nn", dtype="float16")  # 108 tiles of 128 x 128
    plain, streamed = fill(config_from_name(STREAM[:-3]), problem, H200), fill(config_from_name(STREAM), problem, H200)
    assert (plain.units, plain.waves, f"{plain.efficiency:.2f}") == (108, 1, "0.82")
    assert streamed.shared_tiles == 108 and streamed.whole_tiles == 0 and streamed.efficiency > 0.99
    assert "stream-K: 108 shared by the SMs" in streamed.describe()
    assert relative_cost(config_from_name(STREAM), problem, H200) < relative_cost(config_from_name(STREAM[:-3]),
                                                                                  problem, H200)
    # the predictor that carries records to other shapes counts only the tile padding for it, as for SIMT's
    from autogemm.results.predict import utilization

    assert utilization(config_from_name(STREAM), problem, H200) > utilization(config_from_name(STREAM[:-3]), problem, H200)
    # whole waves, then the rest shared: 576 tiles are 4 waves of 132 and 48, which take the fourth along
    cube = Problem.from_layout(3000, 3000, 3000, "nn", dtype="bfloat16")
    waves = fill(config_from_name(STREAM), cube, H200)
    assert (waves.whole_tiles, waves.shared_tiles) == (396, 180)
    # a full last wave leaves nothing to share: as the plain kernel
    full = Problem.from_layout(128 * 12, 128 * 11, 4096, "nt", dtype="bfloat16")
    assert fill(config_from_name(STREAM), full, H200).shared_tiles == 0


STREAM_VARIANTS = [
    (STREAM, Problem.from_layout(333, 4544, 18176, "nn", dtype="float16")),
    ("hopper_128x256x64_w64x256_s3_g8_k1_o1_p_ts_sw_sk", Problem.from_layout(1000, 3001, 200, "tn", dtype="bfloat16")),
    ("hopper_64x192x64_w64x192_s5_g8_k1_o1_p_sk", Problem.from_layout(100, 700, 5000, "nt", dtype="float16")),
    ("hopper_128x128x64_w64x128_s4_g8_k1_o1_p_ts_sk",
     Problem.from_layout(500, 700, 5000, "tt", dtype="bfloat16", epilogue=Epilogue("n", "gelu", True))),
    ("hopper_128x128x32_w64x128_s5_g8_k1_o1_p_sk", Problem.from_layout(300, 500, 700, "tt", dtype="float32", compute="tf32")),
]


def compiles_without_spills(name: str, problem: Problem) -> None:
    """Config `name`, valid for `problem` on an H200, compiles for sm_90a with no spill, no stack frame and
    its wgmmas not serialized (also tests/test_hopper_stmatrix.py's)."""
    config = config_from_name(name)
    assert config.check(problem, H200) == [], config.check(problem, H200)
    report = nvrtc_resources(render(config, problem), "sm_90")
    assert all(not use.spills and not use.stack_bytes and not use.wgmma_serialized for use in report.values()), report


def refuses_with(name: str, problem: Problem, reason: str) -> None:
    """Config `name`'s check refuses `problem` on an H200 with a reason that starts with `reason` (also
    tests/test_hopper_split_n.py's and tests/test_hopper_preload.py's)."""
    reasons = config_from_name(name).check(problem, H200)
    assert any(r.startswith(reason) for r in reasons), reasons


@pytest.mark.parametrize("name, problem", STREAM_VARIANTS, ids=[n for n, _ in STREAM_VARIANTS])
def test_stream_k_kernels_compile_without_spills(name, problem):
    compiles_without_spills(name, problem)


def test_the_seeds_may_stream_k_where_the_space_offers_it(tmp_path):
    """wave_seeds ranks the stream-K shapes beside the others where a space lists the knob."""
    from autogemm.kernels.space import SearchSpace
    from autogemm.tuning.wave_seeds import wave_ranked

    text = SearchSpace.load("hopper").path.read_text()
    assert "\nswap = [false, true]\n" in text
    path = tmp_path / "hopper_stream_k.toml"
    path.write_text(text.replace("\nswap = [false, true]\n", "\nswap = [false, true]\nstream_k = [false, true]\n"))
    problem = Problem.from_layout(333, 4544, 18176, "nn", dtype="float16")
    seeds = wave_ranked(SearchSpace.load(path), problem, H200)
    assert any(seed.stream_k for seed in seeds), [s.name for s in seeds]
    assert len({seed.name for seed in seeds}) == len(seeds)
    assert not any(seed.stream_k for seed in wave_ranked(SearchSpace.load("hopper"), problem, H200))
