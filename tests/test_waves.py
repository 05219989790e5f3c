"""Waves on 132 SMs (families/waves.py), the search's seeds from them (tuning/wave_seeds.py), the keep rule
of GPU-bound products timed sustained (tuning/outcome.py: retimed_best, keeps_cublas), and the records that carry
those figures. CPU only: the device's limits are Hopper's, its SM count an H200's."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.families.waves import fill, relative_cost
from autogemm.kernels.space import SearchSpace
from autogemm.measure.evaluate import Evaluator, Latency, Measurement, Sustained
from autogemm.problem import Device, Problem
from autogemm.tuning import outcome
from autogemm.tuning.outcome import keeps_cublas
from autogemm.tuning.wave_seeds import wave_ranked

H200 = dataclasses.replace(Device.for_arch("sm_90"), name="NVIDIA H200", sm_count=132)
WIDE = "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_ts"  # the shipped records' usual tile


def bf16(m, n, k, layout="nt"):
    return Problem(m, n, k, dtype="bfloat16", trans_a=layout[0] == "t", trans_b=layout[1] == "t")


@pytest.mark.parametrize("m, n, tiles, full", [(640, 4096, 80, 0.61), (256, 4096, 32, 0.24), (256, 11008, 86, 0.65),
                                                (8192, 8192, 2048, 0.97)])
def test_wide_tiles_fill_132_sms_as_counted_by_hand(m, n, tiles, full):
    """The counts of the half-precision issue: 128 x 256 tiles leave most of an H200 idle on short M."""
    waves = fill(config_from_name(WIDE), bf16(m, n, 4096), H200)
    assert waves.units == tiles and waves.efficiency == pytest.approx(full, abs=0.005)
    assert f"{tiles} tiles of 128x256" in waves.describe()


def test_splits_pairs_ping_pong_and_swapped_roles_count_as_the_kernel_deals_them():
    problem = bf16(256, 4096, 14336)
    split = config_from_name("hopper_128x128x64_w64x128_s5_g8_k2_o1_p_ts")
    assert fill(split, problem, H200).units == 2 * 64 and "x 2 splits" in fill(split, problem, H200).describe()
    # a cluster's partner past the last row tile still runs: 5 row tiles take 3 pairs
    paired = config_from_name("hopper_128x192x64_w64x192_s4_g8_k1_o1_p_c2_ts")
    assert fill(paired, bf16(640, 4096, 4096), H200).units == 6 * 22
    # ping-pong consumers take wm-row tiles in turns: an SM is still one place
    pingpong = config_from_name("hopper_128x128x64_w64x128_s5_g8_k1_o1_p_ts_pp")
    waves = fill(pingpong, bf16(4096, 4096, 4096), H200)
    assert waves.tile == (64, 128) and waves.slots == 132 and waves.units == 64 * 32
    # swapped roles tile the swapped product: rows over N
    swapped = config_from_name("hopper_128x192x64_w64x192_s4_g8_k1_o1_p_ts_sw")
    assert fill(swapped, bf16(640, 4096, 4096), H200).units == 32 * 4


def test_the_cost_prefers_full_waves_and_large_tiles_where_both_fill():
    narrow = bf16(640, 4096, 4096)
    wide, filling = config_from_name(WIDE), config_from_name("hopper_128x192x64_w64x192_s4_g8_k1_o1_p_ts")
    assert relative_cost(filling, narrow, H200) < relative_cost(wide, narrow, H200)
    cube = bf16(8192, 8192, 8192)
    small = config_from_name("hopper_128x64x64_w64x64_s5_g8_k1_o1_p_ts")
    assert relative_cost(wide, cube, H200) < relative_cost(small, cube, H200)
    # split-K pays for its partial sums: where the tiles fill the GPU alone, no split is cheaper
    split = config_from_name("hopper_128x256x64_w64x256_s4_g8_k2_o1_p_ts")
    assert relative_cost(wide, cube, H200) < relative_cost(split, cube, H200)


@pytest.mark.parametrize("m, n, k, layout", [(640, 4096, 4096, "nt"), (256, 4096, 14336, "nn"), (256, 11008, 4096, "nt"),
                                             (3000, 3000, 3000, "nn"), (512, 4096, 4096, "nt"), (8192, 8192, 8192, "nt")])
def test_the_seeds_are_valid_configs_of_the_space_that_fill_the_gpu(m, n, k, layout):
    space, problem = SearchSpace.load("hopper"), bf16(m, n, k, layout)
    seeds = wave_ranked(space, problem, H200)
    assert 1 < len(seeds) <= 6 and len({seed.name for seed in seeds}) == len(seeds)
    for seed in seeds:
        assert not seed.check(problem, H200), seed.name
        assert space.knob_values(seed) is not None, seed.name
    assert fill(seeds[0], problem, H200).efficiency > 0.8
    # the first is the cheapest; none is a tile whose last wave the wide tile already fills worse
    costs = [relative_cost(seed, problem, H200) for seed in seeds]
    assert costs == sorted(costs)
    assert costs[0] <= relative_cost(config_from_name(WIDE), problem, H200)


def test_seeds_reach_for_the_tiles_that_won_on_the_h200():
    """Measured on an H200 (short timings, BF16 NT): 640x4096x4096 128x160 0.87-0.91x cuBLAS (128x256: 0.70x);
    256x11008x4096 128x192 0.88x; 256x4096x14336 NN 128x128 split 2 0.995x (128x256 unsplit: 0.35x); and
    cuBLAS's own choice at 256x4096x4096 is 64x128. Widths in steps of 16 (sustained, FP16 NT, against torch.matmul):
    256x9216x3072 128x144 0.945x (128 tiles; 128x192: 0.784x, 96 tiles), 640x27648x5120 128x176 0.957x (790 tiles,
    6 full waves; 128x224: 0.922x); cuBLAS ran 128x144 and 128x176 there itself."""
    space = SearchSpace.load("hopper")
    assert all(seed.bn == 160 for seed in wave_ranked(space, bf16(640, 4096, 4096), H200)[:2])
    assert wave_ranked(space, bf16(256, 11008, 4096), H200)[0].bn == 176  # 126 tiles (128 x 192: 116)
    assert wave_ranked(space, bf16(256, 9216, 3072), H200)[0].bn == 144
    assert wave_ranked(space, bf16(640, 27648, 5120), H200)[0].bn == 176
    assert wave_ranked(space, bf16(256, 4096, 14336, "nn"), H200)[0].split_k > 1
    assert fill(wave_ranked(space, bf16(256, 4096, 4096), H200)[0], bf16(256, 4096, 4096), H200).tile == (64, 128)


def test_an_activation_epilogue_ranks_the_ping_pong_tile_that_hides_it_first():
    """Measured on an H200 at 1536 x 18176 x 4544 FP16 with a bias and SiLU (session 46, sustained): ping-pong
    128 x 128 tiles with the fast forms ran 429 us, cooperative 128 x 192 ones 484 (eager: 449). The consumers
    compute the epilogue before the store; only the other ping-pong consumer's main loop hides it."""
    space = SearchSpace.load("hopper")
    for activation in ("silu", "gelu"):
        layer = Problem.from_layout(1536, 18176, 4544, "nt", dtype="float16", epilogue=Epilogue("n", activation))
        first = wave_ranked(space, layer, H200)[0]
        assert first.pingpong and first.tile_rows == 128 and first.fast_activation, (activation, first.name)
    pingpong = config_from_name("hopper_256x128x64_w128x128_s4_g8_k1_o1_p_ts_pp")
    cooperative = config_from_name("hopper_128x128x64_w64x128_s4_g8_k1_o1_p_ts")
    bare, gelu = bf16(4096, 4096, 4096), Problem(4096, 4096, 4096, dtype="bfloat16", epilogue=Epilogue("n", "gelu"))
    # the same tiles: the epilogue costs both, the cooperative one more
    extra = {c.name: relative_cost(c, gelu, H200) - relative_cost(c, bare, H200) for c in (pingpong, cooperative)}
    assert 0 < extra[pingpong.name] < extra[cooperative.name]


def test_a_bias_layer_ranks_the_ping_pong_tile_that_hides_its_bias_first():
    """Measured on an H200 at BF16 4096 x 13824 x 5120 with a bias along N loaded ahead (session 60, sustained):
    ping-pong 256 x 128 tiles ran 905.6 us (899.0 as a plain GEMM), cooperative 128 x 192 ones 931.8 (888.5); in
    cluster pairs ping-pong ran slower (912.4), so its seed takes none. The model ranks the measured two in that
    order; the tall 256 x 144 tile, not yet measured on this layer, may rank ahead of both."""
    space = SearchSpace.load("hopper")
    layer = Problem.from_layout(4096, 13824, 5120, "nt", dtype="bfloat16", epilogue=Epilogue("n"))
    ranked = wave_ranked(space, layer, H200)
    pingpong = next(i for i, c in enumerate(ranked) if c.pingpong and c.tile_rows == 128 and c.bn == 128)
    cooperative = next(i for i, c in enumerate(ranked) if not c.pingpong and (c.bm, c.bn) == (128, 192))
    assert pingpong < cooperative and ranked[pingpong].preload and ranked[pingpong].cluster == 1, ranked[pingpong].name
    assert not wave_ranked(space, dataclasses.replace(layer, epilogue=Epilogue()), H200)[0].pingpong


def test_every_activation_with_a_fast_form_has_its_cost_in_the_model():
    """waves.FAST_ACTIVATION_FLOPS prices the activations epilogue.FAST_FORM_ACTIVATIONS names: one given a fast
    form without a price would be ranked at the accurate forms' cost."""
    from autogemm.epilogue import FAST_FORM_ACTIVATIONS
    from autogemm.families.waves import FAST_ACTIVATION_FLOPS

    assert set(FAST_ACTIVATION_FLOPS) == set(FAST_FORM_ACTIVATIONS)


@pytest.mark.parametrize("problem", [
    Problem(256, 512, 1024, dtype="float8_e4m3fn", trans_b=True, epilogue=Epilogue(scale="row", out_dtype="bfloat16")),
    Problem(1000, 256, 128, batch=8, dtype="bfloat16", trans_b=True, grouped=True),
], ids=["fp8-row-scales", "grouped"])
def test_products_with_no_swapped_form_get_seeds_without_a_swap(problem):
    """A row-scaled FP8 product or a grouped one has no swapped form: the seeds' probes must not ask for it
    (the GPU tier's FP8 and grouped tunes failed on it)."""
    from autogemm.kernels.space import default_space_name

    space = SearchSpace.load(default_space_name(problem, H200))
    seeds = wave_ranked(space, problem, H200)
    assert seeds and not any(seed.swap for seed in seeds)
    assert all(not seed.check(problem, H200) for seed in seeds)


def test_families_that_are_not_wave_bound_get_no_wave_seeds():
    problem = Problem(8, 4096, 4096)
    assert wave_ranked(SearchSpace.load("gemv"), problem, H200) == []


def test_a_new_study_enqueues_the_wave_seeds_after_what_is_known(tmp_path):
    """The search's seeds in a new study: the known configs, then the wave-ranked, then the space's own."""
    from autogemm.results.cache import TuningCache
    from autogemm.tuning.search import SearchLoop

    problem = bf16(640, 4096, 4096)
    enqueued = []

    class Study:
        trials: list = []

        def enqueue_trial(self, values, skip_if_exists=False):
            enqueued.append(values)

    loop = SearchLoop.__new__(SearchLoop)
    loop.problem, loop.device, loop.space = problem, H200, SearchSpace.load("hopper")
    loop.cache, loop.study = TuningCache(tmp_path / "cache", shipped=False), Study()
    loop.counters, loop.seed_names = type("Counters", (), {"seeded": 0})(), set()
    loop._enqueue_known_configs()
    seeds = wave_ranked(loop.space, problem, H200)
    names = [loop.space.evaluate(values)[0].name for values in enqueued]
    assert names[:len(seeds)] == [seed.name for seed in seeds]
    assert loop.counters.seeded == len(enqueued) > len(seeds)
    assert loop.seed_names >= {seed.name for seed in seeds}  # (measured even past the deadline)


# ---- the keep rule ------------------------------------------------------------------------------------
def test_a_gpu_bound_kernel_that_wins_sustained_is_kept_unless_it_loses_latency_beyond_the_noise():
    even = Latency(kernel_us=100.0, baseline_us=99.6)  # 0.996x one call at a time: within the noise
    assert not keeps_cublas(1.04, 0.01, even, gpu_bound=True)
    assert keeps_cublas(1.04, 0.01, even, gpu_bound=False)  # a short product must win latency too
    assert keeps_cublas(1.04, 0.01, Latency(kernel_us=100.0, baseline_us=97.0), gpu_bound=True)
    assert keeps_cublas(1.009, 0.01, Latency(kernel_us=90.0, baseline_us=100.0), gpu_bound=True)
    assert not keeps_cublas(1.02, 0.01, None, gpu_bound=True)


class _Evaluator(Evaluator):
    """Re-timings, sustained figures and latencies as given."""

    def __init__(self, problem, burst_ms, cublas_ms, sustained):
        self.problem, self.device, self.burst_ms, self.cublas, self.figures = problem, H200, burst_ms, cublas_ms, sustained
        self.sustained_asked: list = []
        self.retime_noise = 0.01

    def retime(self, configs):
        return [Measurement(ok=True, time_ms=ms, tflops=1.0, rel_error=1e-3) for ms in self.burst_ms], self.cublas

    def sustained(self, configs):
        self.sustained_asked.append([c.name for c in configs])
        return self.figures

    def single_call(self, config):
        return Latency(kernel_us=1000.0, baseline_us=1000.0)


FINALISTS = [config_from_name(n) for n in (WIDE, "hopper_128x192x64_w64x192_s4_g8_k1_o1_p_ts",
                                           "hopper_128x128x64_w64x128_s5_g8_k1_o1_p_ts")]


def test_the_best_two_are_timed_sustained_and_the_faster_there_wins_with_its_figures():
    problem = bf16(8192, 8192, 8192)
    # the clocks fall over the rounds: each competitor drifts by 4%, the paired ratios by less than 1%
    drift = [1.00, 1.01, 1.02, 1.03, 1.04]
    sustained = Sustained(kernel_rounds=[[1.70 * d for d in drift], [1.60 * d for d in drift[:4]] + [1.60 * 1.045]],
                          baseline_rounds={"cublaslt": [1.68 * d for d in drift], "cupy.matmul": [1.72] * 5},
                          sm_clock_mhz=1710.0, power_w=699.0)
    evaluator = _Evaluator(problem, [1.50, 1.55, 1.52], 1.52, sustained)
    winner = outcome.retimed_best(FINALISTS, evaluator)
    assert evaluator.sustained_asked == [[FINALISTS[0].name, FINALISTS[2].name]]  # the two fastest re-timings
    assert winner.config.name == FINALISTS[2].name
    assert winner.measurement.time_ms == pytest.approx(1.60 * (1.00 + 1.01 + 1.02 + 1.03 + 1.045) / 5)
    assert winner.cublas_ms == pytest.approx(1.68 * 1.02)
    assert winner.noise == pytest.approx(0.01)  # (the paired ratios' spread, 0.2%, is below the least noise assumed)
    assert sustained.noise(0) == pytest.approx(0.01) and sustained.faster_baseline == "cublaslt"
    assert winner.gpu_bound and winner.baselines == pytest.approx({"cublaslt": 1.68 * 1.02, "cupy.matmul": 1.72})
    assert winner.sustained == {"sm_clock_mhz": 1710.0, "power_w": 699.0, "rounds": 5,
                                "burst_ratio": pytest.approx(1.52 / 1.52)}


PING_PONG = "hopper_256x128x64_w128x128_s5_g8_k1_o1_p_ts_pp_hd"
WIDE_VARIANTS = ["hopper_128x256x64_w64x256_s3_g16_k1_o1_p_ts_hd", "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts_hd"]


def test_a_finalist_of_another_work_shape_is_timed_sustained_beside_the_fastest_re_timing():
    """The tune of BF16 NN 4096 x 11008 x 4096 that kept a 128 x 256 tile: its study's fastest, 256 x 128
    ping-pong, re-timed third behind two 128 x 256 variants, and only those two were timed sustained."""
    problem = bf16(4096, 11008, 4096, "nn")
    finalists = [config_from_name(n) for n in (PING_PONG, *WIDE_VARIANTS)]
    sustained = Sustained(kernel_rounds=[[1.40] * 5, [1.50] * 5], baseline_rounds={"cublaslt": [1.50] * 5})
    evaluator = _Evaluator(problem, [0.600, 0.590, 0.595], 0.62, sustained)
    winner = outcome.retimed_best(finalists, evaluator)
    assert evaluator.sustained_asked == [[WIDE_VARIANTS[0], PING_PONG]]
    assert winner.config.name == WIDE_VARIANTS[0]  # (the first contender's sustained figure, 1.40, is the faster)


class _Timings(_Evaluator):
    """Sustained figures in the order given, one per call; None once they run out (a failed timing)."""

    def __init__(self, problem, burst_ms, cublas_ms, *figures):
        super().__init__(problem, burst_ms, cublas_ms, None)
        self.queue = list(figures)

    def sustained(self, configs):
        self.sustained_asked.append([c.name for c in configs])
        return self.queue.pop(0) if self.queue else None


# cuBLAS swings by 6% from round to round, the kernel not: paired ratios of 0.988 and 1.047, a lead of 1.8%
# inside a noise of 1.9% in ten rounds
SWINGING = Sustained(kernel_rounds=[[1.012] * 10, [1.05] * 10], baseline_rounds={"cublaslt": [1.00, 1.06] * 5})
STEADY_AGAIN = Sustained(kernel_rounds=[[1.012] * 10], baseline_rounds={"cublaslt": [1.03] * 10})


def test_a_lead_inside_the_noise_is_timed_again_and_decided_on_the_pooled_rounds():
    problem = bf16(8192, 8192, 8192)
    first_ratio, first_noise = 1.03 / 1.012, SWINGING.noise(0)
    assert 0.01 < first_noise and first_ratio <= 1 + first_noise  # the first rounds alone keep cuBLAS
    assert keeps_cublas(first_ratio, first_noise, None, gpu_bound=True)
    evaluator = _Timings(problem, [1.50, 1.55, 1.52], 1.52, SWINGING, STEADY_AGAIN)
    winner = outcome.retimed_best(FINALISTS, evaluator)
    assert evaluator.sustained_asked == [[FINALISTS[0].name, FINALISTS[2].name], [FINALISTS[0].name]]
    assert winner.config.name == FINALISTS[0].name and winner.sustained["rounds"] == 20
    assert winner.measurement.time_ms == pytest.approx(1.012) and winner.cublas_ms == pytest.approx(1.03)
    assert winner.noise == pytest.approx(0.01)  # (twice the rounds: 0.94%, below the least noise assumed)
    assert not keeps_cublas(winner.cublas_ms / winner.measurement.time_ms, winner.noise, None, gpu_bound=True)


def test_a_clear_lead_a_kernel_behind_or_a_noise_at_its_least_is_not_timed_again():
    problem = bf16(8192, 8192, 8192)
    behind = Sustained(kernel_rounds=[[1.04] * 10, [1.05] * 10], baseline_rounds={"cublaslt": [1.00, 1.06] * 5})
    least = Sustained(kernel_rounds=[[1.025] * 10, [1.05] * 10], baseline_rounds={"cublaslt": [1.03] * 10})
    clear = Sustained(kernel_rounds=[[0.95] * 10, [1.05] * 10], baseline_rounds={"cublaslt": [1.00, 1.06] * 5})
    for figures in (behind, least, clear):
        evaluator = _Timings(problem, [1.50, 1.55, 1.52], 1.52, figures, STEADY_AGAIN)
        winner = outcome.retimed_best(FINALISTS, evaluator)
        assert len(evaluator.sustained_asked) == 1 and winner.sustained["rounds"] == 10
    # a second timing that fails leaves the first figures
    evaluator = _Timings(problem, [1.50, 1.55, 1.52], 1.52, SWINGING)
    winner = outcome.retimed_best(FINALISTS, evaluator)
    assert len(evaluator.sustained_asked) == 2 and winner.sustained["rounds"] == 10
    assert winner.noise == pytest.approx(SWINGING.noise(0))


def test_pooled_rounds_stay_paired_with_their_own_baselines():
    first = Sustained(kernel_rounds=[[2.0, 2.0], [1.0, 1.1]], baseline_rounds={"cublaslt": [1.2, 1.3], "cupy.matmul": [1.4, 1.4]},
                      sm_clock_mhz=1500.0, power_w=690.0)
    more = Sustained(kernel_rounds=[[1.05]], baseline_rounds={"cublaslt": [1.25], "cupy.matmul": [1.5]}, sm_clock_mhz=1600.0)
    pooled = first.pooled(1, more)
    assert pooled.kernel_rounds == [[1.0, 1.1, 1.05]] and pooled.baseline_rounds["cublaslt"] == [1.2, 1.3, 1.25]
    assert pooled.sm_clock_mhz == 1550.0 and pooled.power_w == 690.0 and pooled.rounds == 3
    assert first.pooled(1, Sustained(kernel_rounds=[[1.0]], baseline_rounds={"cublaslt": [1.2]})) is None
    assert first.pooled(1, Sustained(kernel_rounds=[[1.0], [1.0]], baseline_rounds=more.baseline_rounds)) is None


def test_sustained_contenders_fall_back_to_the_next_fastest_of_one_shape():
    problem = bf16(4096, 11008, 4096, "nn")
    wide = [config_from_name(n) for n in WIDE_VARIANTS + [WIDE]]
    assert outcome.sustained_contenders(wide, [2, 0, 1], problem, H200) == [2, 0]
    assert outcome.sustained_contenders(wide, [1], problem, H200) == [1]
    assert outcome.sustained_contenders(wide, [], problem, H200) == []
    mixed = wide + [config_from_name(PING_PONG)]
    assert outcome.sustained_contenders(mixed, [0, 1, 2, 3], problem, H200) == [0, 3]


def test_the_noise_is_twice_the_standard_error_of_the_mean_paired_ratio():
    # the baseline swings by 6% from round to round, the kernel not
    unsteady = Sustained(kernel_rounds=[[1.0] * 20], baseline_rounds={"cublaslt": [1.0, 1.06] * 10, "cupy.matmul": [2.0] * 20})
    import statistics

    ratios = [1.0, 1.06] * 10
    assert unsteady.noise(0) == pytest.approx(2 * statistics.stdev(ratios) / 20 ** 0.5 / 1.03)
    assert unsteady.noise(0) > 0.01
    assert unsteady.rounds == 20 and unsteady.baseline_ms == pytest.approx(1.03) and unsteady.kernel_ms == [1.0]
    # a steady pair: the least noise assumed
    steady = Sustained(kernel_rounds=[[1.0] * 20], baseline_rounds={"cublaslt": [1.03] * 20})
    assert steady.noise(0) == 0.01


def test_a_short_product_is_decided_on_the_re_timings_alone():
    problem = bf16(256, 256, 256)
    evaluator = _Evaluator(problem, [0.010, 0.011, 0.012], 0.011, None)
    winner = outcome.retimed_best(FINALISTS, evaluator)
    assert evaluator.sustained_asked == [] and not winner.gpu_bound and winner.cublas_ms == 0.011


def test_a_record_carries_its_sustained_figures_and_refuses_others():
    from autogemm.results.record import Record

    problem = bf16(8192, 8192, 8192)
    config = config_from_name(WIDE)
    record = Record(problem=problem.key, family="hopper", config={k: v for k, v in config.to_dict().items() if k != "family"},
                    config_name=config.name, time_ms=1.6, tflops=problem.flops / 1.6e9, cublas_ms=1.68,
                    cublas_tflops=problem.flops / 1.68e9, ratio=1.05, rel_error=1e-3, template_hash="x", device="NVIDIA H200",
                    sustained={"sm_clock_mhz": 1710.0, "power_w": 699.0, "rounds": 5, "burst_ratio": 1.01})
    again = Record.from_json(record.to_json())
    assert again.sustained == record.sustained
    plain = Record.from_json({k: v for k, v in record.to_json().items() if k != "sustained"})
    assert plain.sustained == {} and "sustained" not in plain.to_json()  # (documents written before stay as they are)
    for bad in ({"clock": 1.0}, {"power_w": -1.0}, {"rounds": "5"}, [1]):
        with pytest.raises(ValueError, match="sustained"):
            Record.from_json({**record.to_json(), "sustained": bad})


# ---- the shipped documents stay current -----------------------------------------------------------------
@pytest.mark.parametrize("document", ["nvidia-h100-80gb-hbm3-sm90.json", "nvidia-h200-sm90.json"])
def test_every_shipped_record_still_renders_its_kernel_byte_for_byte(document):
    """New knobs default to today's code: each shipped record's kernel (a cuBLAS record's: the one it beat)
    renders to the digest it was measured with. The H100 document cannot be re-tuned here."""
    import json
    from pathlib import Path

    from autogemm.kernels.render import kernel_digest
    from autogemm.results.record import Record

    path = Path(__file__).resolve().parent.parent / "cache" / document
    entries = json.loads(path.read_text())["entries"]
    records = [Record.from_json(r) for r in (entries.values() if isinstance(entries, dict) else entries)]
    assert len(records) > 100
    changed = [(r.problem, r.generated_config.name) for r in records if r.generated_config is not None
               and kernel_digest(r.generated_config, r.problem_object) != r.source_digest]
    assert not changed


# ---- tensors served cuBLAS go to torch.matmul -----------------------------------------------------------
def test_a_cublas_plan_of_16_bit_tensors_hands_them_to_torch_matmul():
    """What torch would call is what serves tensors where nothing generated wins: torch.matmul, its own
    algorithm and workspace (float64 too; float32 in the next test)."""
    torch = pytest.importorskip("torch")
    from autogemm.serving.plan import Plan
    from autogemm.serving.select import Choice
    from autogemm.serving.torch_fast_path import torch_matmul_for

    def plan(config):
        return Plan(choice=Choice("cublas", config, "test"), problem=bf16(64, 64, 64), shape=(64, 64), dtype=None,
                    device=0)

    half = torch.ones(2, 2, dtype=torch.bfloat16)
    assert torch_matmul_for(plan(None), half, half) is torch.matmul
    assert torch_matmul_for(plan(None), half.half(), half.half()) is torch.matmul
    assert torch_matmul_for(plan(None), half.double(), half.double()) is torch.matmul
    assert torch_matmul_for(plan(None), half, half.half()) is None
    assert torch_matmul_for(plan(config_from_name(WIDE)), half, half) is None


def test_float32_tensors_go_to_torch_matmul_only_while_pytorch_computes_float32_in_float32():
    """float32 computed as float32 is handed over through float32_matmul, which calls torch.matmul while
    PyTorch's float32 matmuls are float32 and gives the call back (None) once a user allows TF32; float32
    computed in TF32 (compute="tf32") stays with autogemm's launcher."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch._C, "_get_fp32_precision_getter"):
        pytest.skip("this PyTorch has no fp32_precision setting")
    from autogemm.serving.plan import Plan
    from autogemm.serving.select import Choice
    from autogemm.serving.torch_fast_path import float32_matmul, torch_matmul_for

    def plan(compute):
        return Plan(choice=Choice("cublas", None, "test"), problem=Problem(64, 64, 64, dtype="float32", compute=compute),
                    shape=(64, 64), dtype=None, device=0)

    single = torch.arange(4, dtype=torch.float32).reshape(2, 2)
    assert torch_matmul_for(plan("fp32"), single, single) is float32_matmul
    assert torch_matmul_for(plan("tf32"), single, single) is None
    assert torch_matmul_for(plan("fp32"), single, single.double()) is None
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert torch.equal(float32_matmul(single, single), single @ single)  # (CPU tensors: torch computes them too)
        torch.backends.cuda.matmul.allow_tf32 = True
        assert float32_matmul(single, single) is None
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def test_a_plan_whose_guard_settled_on_cublas_hands_its_tensors_to_torch_matmul():
    """A predicted kernel under the guard is registered without torch.matmul; once the guard settles on
    cuBLAS, the plan's tensors go to torch.matmul as a plan that chose cuBLAS from the start does, and a
    later registration finds it so too. A kernel that won keeps serving them."""
    torch = pytest.importorskip("torch")
    from autogemm.serving.plan import Plan
    from autogemm.serving.select import Choice
    from autogemm.serving.torch_fast_path import settled_on_cublas, torch_matmul_for

    def guarded(verdict):
        plan = Plan(choice=Choice("predicted", config_from_name(WIDE), "test", guarded=True), problem=bf16(64, 64, 64),
                    shape=(64, 64), dtype=None, device=0)
        plan.torch_template = torch.empty((), dtype=torch.bfloat16).expand(64, 64)
        if verdict is not None:
            plan.choice.details["guard"] = {"kernel_won": verdict, "ratio": 1.2 if verdict else 0.8}
        return plan

    half = torch.ones(2, 2, dtype=torch.bfloat16)
    assert torch_matmul_for(guarded(None), half, half) is None  # (still deciding: the kernel may win)
    assert torch_matmul_for(guarded(True), half, half) is None
    assert torch_matmul_for(guarded(False), half, half) is torch.matmul
    lost, won, unregistered = guarded(False), guarded(True), guarded(False)
    unregistered.torch_template = None
    for plan in (lost, won, unregistered):
        settled_on_cublas(plan)
    assert lost.torch_matmul is torch.matmul
    assert won.torch_matmul is None and unregistered.torch_matmul is None


# ---- sustained_times, on a simulated GPU whose clocks swing -------------------------------------------------
class _SwingingGpu:
    """A GPU clock (ms) that work advances, 6% slower in two of every four 50-call stretches (a power limit's
    swing, here in step with the segments of two competitors of 1 ms a call, so that an order in step with
    it is measured in one phase), and the few CuPy names timing.sustained_times uses. The swing counts
    from the first segment: sustained_times makes 4 calls of each competitor before (its estimate)."""

    STRETCH = 50  # calls: one 50 ms segment

    def __init__(self, competitors: int = 2):
        import types

        self.now, self.calls, self.before = 0.0, 0, 4 * competitors
        gpu = self

        class Event:
            def record(self, stream=None):
                self.at = gpu.now

            def synchronize(self):
                pass

        class Stream:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def synchronize(self):
                pass

        stream = Stream()
        self.cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
            Event=Event, get_current_stream=lambda: stream, get_elapsed_time=lambda a, b: b.at - a.at))

    def run(self, ms: float) -> None:
        slow = self.calls >= self.before and ((self.calls - self.before) // self.STRETCH) % 4 in (1, 2)
        self.now += ms * (1.06 if slow else 1.0)
        self.calls += 1


def _identical_pair(monkeypatch, order=None, seed=None):
    from autogemm.measure import timing

    gpu = _SwingingGpu()
    monkeypatch.setitem(__import__("sys").modules, "cupy", gpu.cupy)
    if order is not None:  # the rounds' order forced (the alternation the random order replaced)
        monkeypatch.setattr(timing.random.Random, "sample", order)
    rounds = timing.sustained_times({"a": lambda i: gpu.run(1.0), "b": lambda i: gpu.run(1.0)},
                                    rounds=20, round_ms=50.0, warmup_ms=300.0, seed=seed)

    return rounds, statistics.fmean(rounds["a"]) / statistics.fmean(rounds["b"])


def test_sustained_rounds_in_random_order_time_identical_calls_alike_under_swinging_clocks(monkeypatch):
    """Random orders sample every phase of the swing: one draw of 20 rounds can still be off by up to 3% on
    this clock (the comparison's noise), but the draws are unbiased, so that comparisons that each draw their
    own order (`seed` None) are right on average, where one fixed order would err alike in all of them."""
    ratios = []
    for seed in range(24):
        rounds, ratio = _identical_pair(monkeypatch, seed=seed)
        assert len(rounds["a"]) == len(rounds["b"]) == 20  # (the warm-up rounds are not counted)
        assert all(1.0 - 1e-9 <= t <= 1.06 + 1e-9 for t in rounds["a"] + rounds["b"])
        assert abs(ratio - 1) < 0.04
        ratios.append(ratio)
    assert abs(math.exp(statistics.fmean(math.log(r) for r in ratios)) - 1) < 0.005


def test_an_order_in_step_with_the_swing_would_measure_identical_calls_apart(monkeypatch):
    """The check above can fail: rounds in alternating order (a b, b a, ...) in step with the swing keep
    each competitor in one phase, and identical calls measure 6% apart."""
    turns = iter(range(10**6))

    def alternating(self, names, k):
        return list(names) if next(turns) % 2 == 0 else list(reversed(names))

    _, ratio = _identical_pair(monkeypatch, order=alternating)
    assert abs(ratio - 1) > 0.02


class _ClampingGpu(_SwingingGpu):
    """A GPU from idle (ms of its work since the first call): an H200's power limiter's first two clamps, calls
    starting between 950 and 1150 ms of back-to-back work 25% slower and between 1900 and 2100 ms 8% slower
    (measured: ~1320 MHz for some 200 ms about 0.95 s in, where the clock had held ~1500, and up to 9% slower
    calls about 1.9 s in), and steady otherwise."""

    def run(self, ms: float) -> None:
        self.now += ms * (1.25 if 950.0 <= self.now < 1150.0 else 1.08 if 1900.0 <= self.now < 2100.0 else 1.0)
        self.calls += 1


@pytest.mark.parametrize("competitors", [2, 6])
def test_the_sustained_warm_up_outlasts_the_power_limiters_first_two_clamps(monkeypatch, competitors):
    """The timed rounds start after the clamps, whatever the number of competitors; behind the 300 ms warm-up
    there was before, the first fell in the first rounds (52 of 142 series of the unseen epilogue draw had a round
    5% above their median in round 1, about 7 in each round after the fourth), behind 1.5 s the second."""
    from autogemm.measure import timing

    monkeypatch.delenv(timing.WARMUP_ENV, raising=False)  # (the warm-up decisions take, not the test suite's)

    def rounds(**kwargs):
        gpu = _ClampingGpu(competitors)
        monkeypatch.setitem(__import__("sys").modules, "cupy", gpu.cupy)
        names = "abcdef"[:competitors]
        return timing.sustained_times({name: lambda i, gpu=gpu: gpu.run(1.0) for name in names}, **kwargs)

    assert all(t == pytest.approx(1.0) for times in rounds().values() for t in times)
    # (the check can fail: the warm-ups there were before leave a clamp in the timed rounds)
    assert max(t for times in rounds(warmup_ms=300.0).values() for t in times) > 1.1
    assert max(t for times in rounds(warmup_ms=1500.0).values() for t in times) > 1.03


def test_the_warm_up_a_run_sets_is_taken_and_a_bad_one_named_before_a_tune_searches(monkeypatch, capsys):
    from autogemm.cli import main
    from autogemm.measure import timing
    from autogemm.tuning.tuner import tune

    monkeypatch.delenv(timing.WARMUP_ENV, raising=False)
    assert timing.sustained_warmup_ms() == timing.SUSTAINED_WARMUP_MS == 2500.0
    monkeypatch.setenv(timing.WARMUP_ENV, "250")
    assert timing.sustained_warmup_ms() == 250.0
    gpu = _ClampingGpu(2)
    monkeypatch.setitem(__import__("sys").modules, "cupy", gpu.cupy)
    timing.sustained_times({"a": lambda i: gpu.run(1.0), "b": lambda i: gpu.run(1.0)}, rounds=4)
    assert gpu.calls == 8 + 300 + 4 * 100  # (the estimate's calls, 3 warm-up rounds of 2 x 50 ms, 4 rounds)
    for bad in ("abc", "-1", "nan", "1e9", ""):
        monkeypatch.setenv(timing.WARMUP_ENV, bad)
        with pytest.raises(ValueError, match=f"{timing.WARMUP_ENV}='{bad}': a number of milliseconds"):
            timing.sustained_warmup_ms()
        with pytest.raises(ValueError, match=timing.WARMUP_ENV):  # (before any GPU is asked for)
            tune(Problem.from_layout(256, 256, 256, "nt", dtype="float16"))
        assert main(["tune", "--M", "256"]) == 2
        assert f"{timing.WARMUP_ENV}='{bad}'" in capsys.readouterr().err


def test_each_sustained_comparison_draws_its_own_round_order(monkeypatch):
    """One order for every comparison gave each the same position effects: a second torch.matmul under another
    name measured 1.006x the first over eight problems on an H200 (1.001x with an order drawn per problem).
    Without a seed, two comparisons run their competitors in different sequences; with one, alike."""
    from autogemm.measure import timing

    gpu = _SwingingGpu(competitors=3)
    monkeypatch.setitem(__import__("sys").modules, "cupy", gpu.cupy)

    def sequence(**kwargs):
        calls: list[str] = []
        timing.sustained_times({name: (lambda i, name=name: (calls.append(name), gpu.run(1.0)))
                                for name in "abc"}, rounds=20, round_ms=5.0, warmup_ms=15.0, **kwargs)
        return [name for index, name in enumerate(calls) if index == 0 or calls[index - 1] != name]

    assert sequence() != sequence()
    assert sequence(seed=11) == sequence(seed=11)
