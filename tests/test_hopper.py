"""The Hopper family without a GPU: its names, its checks, the tensor-map layouts its launcher asks
the driver for, the rules of TMA that are checked before the driver sees an operand, and the cache
that keeps a repeated call from encoding maps again. (Its kernels are compiled in test_compile and
run in the quick GPU tier.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import autogemm.gpu.tensor_maps as tensor_maps
from autogemm.families import HopperConfig, config_from_name
from autogemm.gpu.launch import PreparedGemm
from autogemm.gpu.tma_launch import operand_layout, output_layout, tma_launcher
from autogemm.gpu.operands import KernelOperand
from autogemm.problem import Device, Problem
from autogemm.kernels.render import render
from autogemm.kernels.space import SearchSpace, candidate_space_names
from autogemm.gpu.tensor_maps import TensorMapCache, TensorMapError, TiledLayout

H100 = Device.for_arch("sm_90")
BIG = Problem(4096, 4096, 4096, dtype="float16", compute="fp32")
TF32_NN = Problem(4096, 4096, 4096, dtype="float32", compute="tf32")


def test_names_round_trip_and_say_what_they_are():
    config = config_from_name("hopper_128x256x64_w64x256_s4_g8_k1_o1_p")
    assert isinstance(config, HopperConfig)
    assert (config.bm, config.bn, config.bk, config.wm, config.stages, config.persistent) == (128, 256, 64, 64, 4, True)
    assert config.consumers == 2 and config.threads == 384 and config.accumulators() == 128
    plain = config.replace(persistent=False, wm=128, bn=128, wn=128)
    assert plain.name == "hopper_128x128x64_w128x128_s4_g8_k1_o1" and config_from_name(plain.name) == plain
    assert plain.consumers == 1 and plain.threads == 256
    paired = config.replace(cluster=2, tma_store=True)
    assert paired.name == "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts" and config_from_name(paired.name) == paired
    with pytest.raises(ValueError, match="not a Hopper config name"):
        config_from_name("hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c1")  # no cluster is written as nothing
    with pytest.raises(ValueError, match="cluster=4 must be one of 1, 2"):
        config.replace(cluster=4).validated()
    turns = config_from_name("hopper_256x128x64_w128x128_s4_g16_k1_o1_p_ts_pp")
    assert turns.pingpong and turns.consumers == 2 and turns.tile_rows == 128 and config.tile_rows == 128


def test_swap_is_a_knob_that_renders_the_swapped_product():
    swapped = config_from_name("hopper_128x256x32_w64x256_s4_g8_k1_o1_p_sw")
    assert swapped.swap is True and swapped.swaps_operands and config_from_name(swapped.name) == swapped
    problem = Problem.from_layout(300, 500, 200, "nn", dtype="float32", compute="tf32")
    kernel = swapped.kernel_problem(problem)
    assert (kernel.m, kernel.n, kernel.layout) == (500, 300, "tt")  # B^T (stored K x N) in A's role
    assert "constexpr bool C_TRANSPOSED = true;" in render(swapped, problem).code
    assert "constexpr bool C_TRANSPOSED = false;" in render(dataclasses.replace(swapped, swap=False),
                                                            Problem.from_layout(300, 500, 200, "nt", dtype="float32",
                                                                                compute="tf32")).code


@pytest.mark.parametrize("layout, name, a_in_registers", [
    ("nn", "hopper_128x256x32_w64x256_s4_g8_k1_o1_p_sw", True),  # swapped: A's role is B's, stored K x N
    ("nt", "hopper_128x256x32_w64x256_s4_g8_k1_o1_p_ts", False),  # both K-major: both from shared memory
    ("nt", "hopper_128x256x32_w64x256_s4_g8_k1_o1_p_sw", False),
    ("tt", "hopper_128x256x32_w64x256_s4_g8_k1_o1_p", True),  # A stored K x M: through registers
])
def test_tf32_reads_shared_memory_k_major_and_takes_a_from_registers_where_it_is_not(layout, name, a_in_registers):
    config = config_from_name(name)
    problem = Problem.from_layout(4096, 4096, 4096, layout, dtype="float32", compute="tf32")
    assert not config.check(problem, H100)
    kernel = config.kernel_problem(problem)
    assert config.a_in_registers(kernel) is a_in_registers and kernel.trans_b
    code = render(config, problem).code
    assert ("constexpr bool A_IN_REGISTERS = true;" in code) is a_in_registers
    assert "constexpr bool TRANSPOSES = false;" in code and ".tf32.tf32" in code and "m64n256k8" in code
    # sixteen-bit types keep the transpose bits and never take A from registers
    sixteen = dataclasses.replace(config, bk=64, tma_store=False)
    code = render(sixteen, Problem.from_layout(4096, 4096, 4096, layout, dtype="float16", compute="fp32")).code
    assert "constexpr bool TRANSPOSES = true;" in code and "constexpr bool A_IN_REGISTERS = false;" in code


def test_pingpong_tiles_are_a_consumers_and_need_two_consumers_on_a_persistent_grid():
    turns = config_from_name("hopper_256x128x64_w128x128_s4_g16_k1_o1_p_ts_pp")
    shared = turns.replace(pingpong=False)
    # a stage holds A's slice of one consumer's 128 rows, not the block's 256
    assert shared.smem_bytes(BIG) - turns.smem_bytes(BIG) == 4 * 128 * 64 * 2
    assert turns.work_units(BIG) == 2 * shared.work_units(BIG) == 32 * 32
    assert not turns.check(BIG, H100)
    lone = config_from_name("hopper_128x128x64_w128x128_s4_g16_k1_o1_p_pp")
    assert any(r.startswith("warp-tile:") and "pingpong" in r for r in lone.check(BIG, H100))
    fixed_grid = turns.replace(persistent=False)
    assert any(r.startswith("grid:") and "pingpong" in r for r in fixed_grid.check(BIG, H100))
    problem = Problem(300, 500, 300, dtype="float16", compute="fp32")
    layout, _ = operand_layout(problem, KernelOperand(False, 304, 0, 0), "A", turns)
    assert layout.box == (64, 128, 1)  # boxes of a consumer's rows


def test_the_store_chunks_take_shared_memory_beside_the_stages():
    config = config_from_name("hopper_128x256x64_w64x256_s4_g8_k1_o1_p")
    stored = config.replace(tma_store=True)
    # two chunks of 64 columns (128 bytes) per consumer row: 2 x 128 rows x 128 bytes
    assert stored.smem_bytes(BIG) - config.smem_bytes(BIG) == 2 * 128 * 128
    assert not stored.check(BIG, H100)  # 4 stages of 48 KB and 32 KB of chunks fit the H100's 227 KB
    reasons = stored.replace(stages=5).check(BIG, H100)
    assert any(r.startswith("shared-memory:") for r in reasons), reasons


def test_clusters_take_pairs_of_tiles_and_persistent_grids_only_what_stays_resident():
    config = config_from_name("hopper_128x256x64_w64x256_s4_g8_k1_o1_c2")
    problem = Problem(3 * 128, 2 * 256, 64, batch=5, dtype="float16")  # three tile rows: two pairs, one half empty
    assert config.work_units(problem) == 2 * 2 * 5
    assert config.grid_blocks(problem, H100) == 2 * config.work_units(problem)
    persistent, device = config.replace(persistent=True), dataclasses.replace(H100, sm_count=132)
    assert persistent.grid_blocks(BIG, device, resident_clusters=60) == 120  # the driver's figure, not 132 / 2
    assert persistent.grid_blocks(BIG, device) == 132
    assert persistent.replace(cluster=1).grid_blocks(BIG, device) == 132
    assert persistent.grid_blocks(Problem(128, 256, 64, dtype="float16"), device) == 2  # one pair, half of it idle


def test_every_shipped_seed_runs_the_big_square_on_an_h100():
    space = SearchSpace.load("hopper")
    tf32 = [dataclasses.replace(TF32_NN, trans_b=trans_b) for trans_b in (False, True)]  # NN and NT
    sixteen_bit = [seed for seed in space.seeds if seed.bk % 64 == 0]
    assert len(sixteen_bit) >= 4 and all(not seed.check(BIG, H100) for seed in sixteen_bit)
    # and TF32's, each in NN or NT; both layouts have one
    served = {p.layout for seed in space.seeds for p in tf32 if not seed.check(p, H100)}
    assert served == {"nn", "nt"} and all(any(not seed.check(p, H100) for p in tf32 + [BIG]) for seed in space.seeds)
    for layout in ("nn", "nt", "tn", "tt"):  # every layout: MN-major operands through wgmma's transpose bits
        problem = Problem.from_layout(255, 257, 1023, layout, dtype="bfloat16", compute="fp32")
        assert not space.seeds[0].check(problem, H100)


@pytest.mark.parametrize("name, problem, device, code", [
    ("hopper_128x256x64_w64x256_s4_g8_k1_o1_p", BIG, Device.for_arch("sm_80"), "tensor-core"),
    ("hopper_128x256x64_w64x256_s4_g8_k1_o1_p", Problem(64, 64, 64, dtype="float64"), H100, "dtype"),
    ("hopper_128x256x64_w128x256_s4_g8_k1_o1_p", BIG, H100, "registers"),  # 256 accumulators a thread
    ("hopper_256x128x64_w64x128_s4_g8_k1_o1_p", BIG, H100, "warp-tile"),  # four consumers
    ("hopper_128x128x64_w64x64_s4_g8_k1_o1_p", BIG, H100, "warp-tile"),  # a consumer narrower than the tile
    ("hopper_128x32x64_w64x32_s4_g8_k1_o1_p", BIG, H100, "fragment"),  # half a swizzled row
    ("hopper_128x128x32_w64x128_s4_g8_k1_o1_p", BIG, H100, "fragment"),
    ("hopper_128x256x128_w64x256_s4_g8_k1_o1_p", BIG, H100, "shared-memory"),  # 4 x 96 KB
    ("hopper_128x256x64_w64x256_s4_g8_k2_o1_p", Problem(4096, 4096, 64, dtype="bfloat16"), H100,
     "split-k"),  # two splits of one K slice
    ("hopper_128x256x64_w64x256_s4_g8_k1_o2_p", BIG, H100, "occupancy"),
    # TF32: shared memory K-major only (no transpose bits), A's fragments in registers where A is not
    ("hopper_128x256x32_w64x256_s4_g8_k1_o1_p", TF32_NN, H100, "layout"),  # needs swap
    ("hopper_128x256x32_w64x256_s4_g8_k1_o1_p_sw", dataclasses.replace(TF32_NN, trans_a=True, trans_b=True), H100,
     "layout"),  # TT swapped: B^T's K strided
    ("hopper_128x256x32_w64x256_s4_g8_k1_o1_p_sw", dataclasses.replace(TF32_NN, trans_a=True), H100, "layout"),  # TN
    ("hopper_128x256x64_w64x256_s2_g8_k1_o1_p_sw", TF32_NN, H100, "registers"),  # 128 + 64 fragment registers
    ("hopper_256x64x32_w128x64_s4_g8_k1_o1_p_ts_sw", TF32_NN, H100, "choice"),  # transposed chunks of 128 rows
    ("hopper_128x256x64_w64x256_s4_g8_k1_o1_p", Problem(64, 64, 64, compute="fp32"), H100, "dtype"),  # FP32 exact
])
def test_check_names_the_reason(name, problem, device, code):
    reasons = config_from_name(name).check(problem, device)
    assert any(reason.startswith(code + ":") for reason in reasons), reasons


def test_the_space_is_searched_for_sixteen_bit_types_and_tf32_on_hopper_only():
    assert "hopper" in candidate_space_names(BIG, H100)
    assert "hopper" in candidate_space_names(TF32_NN, H100)
    assert "hopper" not in candidate_space_names(BIG, Device.for_arch("sm_80"))
    assert "hopper" not in candidate_space_names(Problem(4096, 4096, 4096), H100)  # float32, exact
    assert "hopper" not in candidate_space_names(Problem(1, 4096, 4096, dtype="float16", compute="fp32"), H100)
    space = SearchSpace.load("hopper")
    assert all(not c.check(BIG, H100) for c in space.sample(20, BIG, H100, seed=3))
    drawn = space.sample(20, TF32_NN, H100, seed=3)
    assert drawn and all(c.swap and not c.check(TF32_NN, H100) for c in drawn)  # NN in TF32: always swapped


@pytest.mark.parametrize("layout, a_dims, a_box, b_dims, b_box", [
    # K-major A (M x K): boxes of 64 K x bm; MN-major B (K x N): boxes of 64 N x bk
    ("nn", (300, 200, 1), (64, 128, 1), (500, 300, 1), (64, 64, 1)),
    ("nt", (300, 200, 1), (64, 128, 1), (300, 500, 1), (64, 256, 1)),
    ("tn", (200, 300, 1), (64, 64, 1), (500, 300, 1), (64, 64, 1)),
    ("tt", (200, 300, 1), (64, 64, 1), (300, 500, 1), (64, 256, 1)),
])
def test_tensor_maps_describe_each_operand_as_stored(layout, a_dims, a_box, b_dims, b_box):
    config = config_from_name("hopper_128x256x64_w64x256_s4_g8_k1_o1_p")
    problem = Problem.from_layout(200, 500, 300, layout, dtype="float16", compute="fp32")
    ld_a, ld_b = a_dims[0] + 8, b_dims[0] + 16  # pitches wider than the rows
    a = KernelOperand(transposed=problem.trans_a, ld=ld_a, batch_stride=0, pointer=0)
    b = KernelOperand(transposed=problem.trans_b, ld=ld_b, batch_stride=0, pointer=0)
    (layout_a, step_a), (layout_b, step_b) = operand_layout(problem, a, "A", config), operand_layout(problem, b, "B", config)
    assert (layout_a.dims, layout_a.box, layout_b.dims, layout_b.box) == (a_dims, a_box, b_dims, b_box)
    assert layout_a.strides[0] == 2 * ld_a and layout_b.strides[0] == 2 * ld_b
    assert step_a == step_b == 0  # one matrix shared by the batch: coordinate 0 always


def test_a_swapped_store_maps_c_as_the_user_holds_it():
    config = config_from_name("hopper_128x256x32_w64x256_s4_g8_k1_o1_p_ts_sw")
    user = Problem.from_layout(300, 500, 200, "nn", dtype="float32", compute="tf32")
    assert not config.check(user, H100)
    kernel = config.kernel_problem(user)  # 500 x 300: C^T
    c = output_layout(kernel, KernelOperand(False, 504, 0, 0), config)
    assert c.dims == (500, 300, 1) and c.strides == (4 * 504, 4 * 504 * 300) and c.box == (32, 64, 1)
    plain = output_layout(user, KernelOperand(False, 504, 0, 0), dataclasses.replace(config, swap=False))
    assert plain.dims == c.dims and plain.strides == c.strides


def test_tf32_operands_are_mapped_as_tfloat32_which_tma_rounds_and_c_as_float32():
    config = config_from_name("hopper_128x256x32_w64x256_s4_g8_k1_o1_p_ts")
    problem = Problem.from_layout(200, 500, 300, "nt", dtype="float32", compute="tf32")
    a = KernelOperand(transposed=False, ld=304, batch_stride=0, pointer=0)
    b = KernelOperand(transposed=True, ld=304, batch_stride=0, pointer=0)
    (layout_a, _), (layout_b, _) = operand_layout(problem, a, "A", config), operand_layout(problem, b, "B", config)
    assert layout_a.element == layout_b.element == "CU_TENSOR_MAP_DATA_TYPE_TFLOAT32"
    assert (layout_a.box, layout_b.box) == ((32, 128, 1), (32, 256, 1))  # 32 floats: one 128-byte row
    assert layout_a.strides[0] == 4 * 304 and not layout_a.problems(0, "A")
    c = output_layout(problem, KernelOperand(False, 504, 0, 0), config)
    assert c.element == "CU_TENSOR_MAP_DATA_TYPE_FLOAT32" and c.box == (32, 64, 1)


def test_a_batched_operand_steps_through_its_matrices():
    config = config_from_name("hopper_128x128x64_w64x128_s3_g8_k1_o1_p")
    problem = Problem(64, 80, 96, batch=3, dtype="bfloat16", compute="fp32")
    layout, step = operand_layout(problem, KernelOperand(False, 96, 64 * 96 + 32, 0), "A", config)
    assert layout.dims == (96, 64, 3) and layout.strides == (192, 2 * (64 * 96 + 32)) and step == 1


HALF, SINGLE = "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"


@pytest.mark.parametrize("layout, address, fault", [
    (TiledLayout(HALF, 2, (65, 10, 1), (130, 1300), (64, 64, 1)), 0, "pitch of 130 bytes"),
    (TiledLayout(HALF, 2, (64, 10, 1), (128, 1280), (64, 64, 1)), 8, "not 16-byte aligned"),
    (TiledLayout(HALF, 2, (64, 10, 1), (128, 1280), (64, 512, 1)), 0, "box extent 512"),
    (TiledLayout(SINGLE, 4, (64, 10, 1), (256, 2560), (64, 64, 1)), 0, "exceeds the 128-byte swizzle"),
    (TiledLayout("", 1, (64, 10, 1), (128, 1280), (64, 64, 1)), 0, "does not copy its element type"),
    (TiledLayout(HALF, 2, (64, 0, 1), (128, 1280), (64, 64, 1)), 0, "extent 0"),
])
def test_what_tma_cannot_take_is_named_before_the_driver_is_asked(layout, address, fault, monkeypatch):
    monkeypatch.setattr(tensor_maps, "driver", lambda: pytest.fail("the driver was asked"))
    with pytest.raises(TensorMapError, match=fault):
        tensor_maps.encode(layout, address, "A")


def test_a_repeated_address_encodes_no_map_again(monkeypatch):
    encoded = []

    def fake_encode(layout, address, operand):
        encoded.append(address)
        return np.full(16, address, dtype=np.uint64)

    monkeypatch.setattr(tensor_maps, "encode", fake_encode)
    cache = TensorMapCache(TiledLayout(HALF, 2, (64, 64, 1), (128, 8192), (64, 64, 1)), "A", capacity=2)
    first, where = cache.get(0x1000)
    assert where == first.ctypes.data and first[0] == 0x1000
    assert cache.get(0x1000)[0] is first and encoded == [0x1000]
    cache.get(0x2000)
    cache.get(0x3000)  # the least recently used (0x1000) goes
    assert len(cache) == 2
    cache.get(0x1000)
    assert encoded == [0x1000, 0x2000, 0x3000, 0x1000]


def test_a_map_argument_is_read_from_where_it_points():
    from autogemm.gpu.packed_launch import PackedKernel

    class Function:
        ptr = 0

    blank = np.zeros(1, dtype=tensor_maps.MAP_DTYPE)[0]
    kernel = PackedKernel(Function(), (1, 1, 1), (1, 1, 1), 0, ("map", "n"), {"n": np.int32(7), "map": blank})
    words = np.arange(16, dtype=np.uint64)
    kernel.point(kernel.index("map"), words.ctypes.data)
    assert kernel.arguments() == {"map": words.tobytes(), "n": 7}


def test_the_output_map_describes_c_in_store_chunks():
    config = config_from_name("hopper_256x128x64_w128x128_s3_g8_k1_o1_p_ts")
    problem = Problem(300, 500, 64, batch=3, dtype="bfloat16", compute="fp32")
    layout = output_layout(problem, KernelOperand(False, 504, 300 * 504, 0), config)
    assert layout.dims == (500, 300, 3) and layout.strides == (1008, 2 * 300 * 504) and layout.box == (64, 128, 1)
    single = output_layout(Problem(300, 500, 64, dtype="float16"), KernelOperand(False, 512, 0, 0), config)
    assert single.dims == (500, 300, 1) and single.strides == (1024, 1024 * 300)  # a batch of one: any valid pitch


@pytest.mark.parametrize("ldc, expected", [
    (512, [1, 0, 1]),  # aligned pitch: TMA stores, except at a misaligned address (the direct path)
    (500 + 2, [0, 0, 0]),  # a pitch of 1004 bytes TMA cannot take: always the direct path
])
def test_a_c_that_tma_cannot_address_is_written_from_registers(ldc, expected, monkeypatch):
    from types import SimpleNamespace

    from autogemm.gpu.packed_launch import PackedKernel

    def fake_encode(layout, address, operand):
        faults = layout.problems(address, operand)
        if faults:
            raise TensorMapError("; ".join(faults))
        return np.full(16, address, dtype=np.uint64)

    launched = []
    monkeypatch.setattr(tensor_maps, "encode", fake_encode)
    monkeypatch.setattr(PackedKernel, "launch", lambda self, stream: launched.append(self.arguments()))
    launch = _fake_hopper_launcher(ldc)
    stream = SimpleNamespace(ptr=0)
    for address in (0x10000, 0x20002, 0x10000):
        launch(0x1000, 0x2000, address, 1.0, 0.0, stream)
    assert [arguments["c_mapped"] for arguments in launched] == expected
    assert [arguments["C"] for arguments in launched] == [0x10000, 0x20002, 0x10000]  # C itself, for the direct path
    if expected[0]:
        assert launched[0]["map_c"] == np.full(16, 0x10000, dtype=np.uint64).tobytes()  # the map of C's address


def test_without_cuda_bindings_a_cluster_grid_says_what_to_install(monkeypatch):
    import builtins

    from autogemm.gpu.tma_launch import resident_clusters

    real_import = builtins.__import__

    def no_bindings(name, *args, **kwargs):
        if name.startswith("cuda.bindings") or name == "cuda":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bindings)
    with pytest.raises(TensorMapError, match="cuda-bindings package"):
        resident_clusters(None, 384, 200_000, 2)


def _fake_hopper_launcher(ldc: int = 512):
    """The launcher of a Hopper kernel that is never loaded (its launch is patched by the caller)."""
    from types import SimpleNamespace

    class Function:
        ptr = 0

    config = config_from_name("hopper_128x128x64_w64x128_s3_g8_k1_o1_p_ts")
    problem = Problem(300, 500, 64, dtype="float16", compute="fp32")
    kernel = SimpleNamespace(gemm=Function(), source=render(config, problem))
    prepared = PreparedGemm(config=config, problem=problem, kernel=kernel, grid=(132, 1, 1), block=(384, 1, 1),
                            smem=config.smem_bytes(problem), tiles_per_split=1)
    a, b = KernelOperand(False, 64, 0, 0), KernelOperand(False, 512, 0, 0)
    return tma_launcher(prepared, a, b, KernelOperand(False, ldc, 0, 0), 0)


def test_switching_among_many_operands_always_points_at_the_right_map(monkeypatch):
    """More weights than the launcher's recent maps and the cache hold, in turn: every launch must
    read the map of its own operands (none stale, none freed while pointed at)."""
    import gc
    from types import SimpleNamespace

    from autogemm.gpu.packed_launch import PackedKernel

    encoded = []

    def fake_encode(layout, address, operand):
        encoded.append(address)
        return np.full(16, address, dtype=np.uint64)

    launched = []
    monkeypatch.setattr(tensor_maps, "encode", fake_encode)
    monkeypatch.setattr(PackedKernel, "launch", lambda self, stream: launched.append(self.arguments()))
    # what exists before the launcher is frozen out of the collections below: each then looks at the
    # launcher's own objects only (a full collection of a test process's heap took 0.1-0.4 s, 60 times)
    gc.freeze()
    try:
        launch = _fake_hopper_launcher()
        weights = [0x100000 * (i + 1) for i in range(20)]
        for turn in range(3):
            for i, weight in enumerate(weights):
                launch(0x1000 + 0x100 * (i % 2), weight, 0x9000, 1.0, 0.0, SimpleNamespace(ptr=0))
                gc.collect()
                arguments = launched[-1]
                assert arguments["map_b"] == np.full(16, weight, dtype=np.uint64).tobytes(), (turn, i)
                assert arguments["map_a"] == np.full(16, 0x1000 + 0x100 * (i % 2), dtype=np.uint64).tobytes()
    finally:
        gc.unfreeze()
    assert encoded.count(0x1000) == 1 and encoded.count(0x9000) == 1  # the two activations and C: once each


@pytest.mark.parametrize("activation, bias", [("gelu_tanh", "n"), ("", "n"), ("silu", "n"), ("", "m")])
def test_pingpong_split_k_with_an_epilogue_stops_at_the_width_that_compiles_without_spills(activation, bias):
    """Ping-pong consumers adding split-K's partial sums and applying a fused epilogue spilled 8-20 bytes at
    bn 208-256 (ptxas, each width with some of these epilogues); 192 compiled clean with all of them, and the
    bare kernels of every width do."""
    from autogemm.epilogue import Epilogue
    from test_hopper_stream_k import compiles_without_spills

    problem = Problem.from_layout(1000, 3000, 2000, "nt", dtype="bfloat16", epilogue=Epilogue(bias, activation))
    bare = dataclasses.replace(problem, epilogue=Epilogue())
    for bn in (208, 224, 240, 256):
        config = config_from_name(f"hopper_128x{bn}x64_w64x{bn}_s4_g1_k2_o1_p_ts_pp_hd")
        refused = config.check(problem, H100)
        assert any(reason.startswith("registers: pingpong with split_k=2") for reason in refused), (bn, refused)
        assert not config.check(bare, H100)
    widest = "hopper_128x192x64_w64x192_s4_g1_k2_o1_p_ts_pp_hd"
    assert not config_from_name(widest).check(problem, H100)
    compiles_without_spills(widest, problem)
