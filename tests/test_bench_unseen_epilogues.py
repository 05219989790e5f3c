"""benchmarks/bench_unseen_epilogues.py without a GPU: the seeded draw (what the epilogue issue asks of it),
--list, and the figures its table judges (benchmarks/unseen_epilogues_table.py: the ratios, the ceiling and the
share captured)."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_unseen_epilogues.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

bench = load_script(SCRIPT)
import unseen_epilogues_table as table  # noqa: E402  (the table's module: benchmarks/ is on the path above)


@pytest.fixture(scope="module", params=[bench.SEED, 7])
def problems(request):
    return bench.epilogue_problems(request.param)


def test_the_draw_is_24_unseen_layers_the_same_for_a_seed(problems):
    from bench_unseen import known_keys

    assert len(problems) == bench.COUNT >= 24
    keys = [bench._problem(spec).key for spec in problems]
    assert len(set(keys)) == len(keys) and not set(keys) & known_keys()
    assert bench.epilogue_problems(bench.SEED) == bench.epilogue_problems(bench.SEED)
    assert bench.epilogue_problems(bench.SEED) != bench.epilogue_problems(7)


def test_the_mix_is_the_one_asked_for(problems):
    assert collections.Counter(spec[0] for spec in problems) == {"bfloat16": 12, "float16": 12}
    assert collections.Counter(spec[1] for spec in problems) == {case: 6 for case in bench.CASES}
    ms = [spec[2] for spec in problems]
    assert min(ms) < 16 and max(ms) >= 4096 and sum(m >= table.CAPTURE_FROM_M for m in ms) >= 4
    assert bench.draw_shortfalls(problems) == []
    tuned = bench._campaign_widths()
    assert not any(spec[3] in tuned or spec[4] in tuned for spec in problems)
    assert all(2 * m * n * k <= bench.MAX_FLOPS for _, _, m, n, k in problems)
    # the problem's key names its epilogue (a bias along N, the activation, a residual)
    assert {bench._problem(spec).key.rsplit("/", 1)[1] for spec in problems} == {"bias_n", "bias_n+gelu", "bias_n+silu", "res"}


def test_a_seed_whose_draw_lacks_the_large_layers_is_refused_as_the_publication(monkeypatch, capsys):
    # seed 8123 draws M up to 3072 only: it was drawn as the publication once, before this check
    assert bench.draw_shortfalls(bench.epilogue_problems(8123)) == ["no layer of 4096 rows or more (the most: 3072)"]
    monkeypatch.setattr(bench, "SEED", 8123)
    with pytest.raises(SystemExit) as refused:
        bench.main([])
    assert refused.value.code == 2 and "seed 8123 cannot be the published draw" in capsys.readouterr().err


def test_judged_first_measures_the_layers_whose_capture_is_judged_before_the_others_in_the_draw_s_order():
    specs = bench.epilogue_problems(8124)
    assert bench.measurement_order(specs) == list(enumerate(specs))
    order = bench.measurement_order(specs, judged_first=True)
    judged = [index for index, spec in enumerate(specs) if spec[2] >= table.CAPTURE_FROM_M]
    assert [index for index, _ in order[:len(judged)]] == judged and len(judged) == 4
    assert [index for index, _ in order[len(judged):]] == [i for i in range(len(specs)) if i not in judged]
    assert all(specs[index] == spec for index, spec in order)  # (each keeps its index)


def test_list_runs_without_a_gpu():
    listed = subprocess.run([sys.executable, str(SCRIPT), "--list", "--count", "8"], capture_output=True, text=True,
                            check=True)
    assert len(listed.stdout.splitlines()) == 8 and "/bias_n" in listed.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "--list", "--count", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--count" in bad.stderr


def _figures(ours, eager, alone, compiled=None, lt=None, ours_tanh=None):
    figures = {table.AUTOGEMM: ours, table.EAGER: eager, table.GEMM_ALONE: alone}
    if compiled is not None:
        figures[table.COMPILED] = compiled
    if lt is not None:
        figures[table.CUBLASLT] = lt
    if ours_tanh is not None:
        figures[table.AUTOGEMM_TANH] = ours_tanh
    return figures


def test_the_ratios_ceiling_and_share_captured():
    figures = _figures(ours=110.0, eager=120.0, alone=100.0, compiled=99.0, lt=105.0, ours_tanh=100.0)
    assert table.ratio(figures, table.EAGER) == pytest.approx(120 / 110)
    assert table.ratio(figures, table.COMPILED) == pytest.approx(99 / 110)
    assert table.ratio(figures, table.CUBLASLT) == pytest.approx(105 / 100)  # against the same GELU form
    assert table.ratio(_figures(110.0, 120.0, 100.0), table.CUBLASLT) is None
    top, share = table.ceiling(figures)
    assert top == pytest.approx(1.2) and share == pytest.approx(0.5)  # 10 of eager's 20 us over the GEMM
    assert table.ceiling(_figures(ours=101.0, eager=99.0, alone=100.0))[1] is None  # eager's epilogue free


def _row(index, spec, untuned, tuned, kept=True):
    return {"index": index, "spec": list(spec), "problem": bench._problem(spec).key, "label": bench.label(spec),
            "source_digest": "d", "kernels_kept": True, "untuned": {"sustained_us": untuned, "latency_us": untuned, "served": "cuBLAS"},
            "tuned": {"sustained_us": tuned, "latency_us": tuned, "served": "cuBLAS"},
            "tune": {"s": 30.0, "kept_cublas": kept, "config": "x", "ratio": 0.9}}


def test_the_report_judges_what_the_issue_asks():
    rows = [_row(0, ("bfloat16", "bias+silu", 2048, 9216, 2304), _figures(100.0, 98.0, 90.0), _figures(93.0, 98.0, 90.0, 95.0)),
            _row(1, ("float16", "bias", 8, 9216, 2304), _figures(20.0, 21.0, 20.0), _figures(20.0, 21.0, 20.0, 30.0),
                 kept=False)]
    text = "\n".join(table.report(rows, "GPU", bench.SEED))
    assert "| untuned | sustained | eager | 2 | " in text
    untuned_min = min(98 / 100, 21 / 20)
    assert f"| untuned | sustained | eager | 2 | {(98 / 100 * 21 / 20) ** 0.5:.3f} | {untuned_min:.3f} |" in text
    assert "| tuned | sustained | torch.compile | 2 |" in text
    # one problem at M >= 1024: (98 - 93) / (98 - 90) captured
    assert "at least 60% on 1 of 1 problems (median 62%" in text
    assert "different codes" not in text and "(compiled kernels kept for the run)" in text
    rows[1]["source_digest"], rows[1]["kernels_kept"] = "e", False
    text = "\n".join(table.report(rows, "GPU", bench.SEED))
    assert "measured with 2 different codes" in text and "kept for the run in some rows, compiled afresh in others" in text
    assert "have not yet" not in text  # (no count of the draw given)
    assert "**2 of the 24 layers drawn have run; the other 22 have not yet.**" in table.report(rows, "GPU", bench.SEED, 24)


def _with_rounds(row, eager, alone):
    """`row` whose tuned phase kept its sustained rounds: eager's and the GEMM alone's, us a call in each round."""
    row["tuned"]["sustained_rounds_us"] = {table.EAGER: eager, table.GEMM_ALONE: alone}
    return row


def test_a_share_of_a_gain_within_its_noise_is_not_judged():
    """Eager's 0.6% over the GEMM alone (a bias cuBLASLt adds in its epilogue) is within the rounds' noise (at least
    1%): its share captured is shown, not judged. A 20% gain with the same spread is judged."""
    wobble = [1.0, -1.0] * 10
    free = _row(0, ("bfloat16", "bias", 4096, 9216, 2304), _figures(100.0, 100.6, 100.0), _figures(100.9, 100.6, 100.0))
    _with_rounds(free, [100.6 + w for w in wobble], [100.0] * 20)
    assert table.ceiling_noise(free["tuned"]) == pytest.approx(0.01) and table.judged_share(free["tuned"]) is None
    costly = _row(1, ("bfloat16", "bias+gelu", 2048, 9216, 2304), _figures(100.0, 120.0, 100.0),
                  _figures(105.0, 120.0, 100.0))
    _with_rounds(costly, [120.0 + w for w in wobble], [100.0] * 20)
    assert table.judged_share(costly["tuned"]) == pytest.approx(0.75)
    text = "\n".join(table.report([free, costly], "GPU", bench.SEED))
    assert "at least 60% on 1 of 1 problems (median 75%, min 75%); on 1 more eager's gain over the GEMM alone is " \
           "within its noise, and not judged." in text
    assert "| 1.006 | -50% (gain within ±1.0%) |" in text  # ((100.6 - 100.9) / 0.6)
    assert "judged where eager beats the GEMM alone by more than the noise" in text
    # rows of before the rounds were kept are judged on any gain, as they were, and the text says nothing of noise
    del free["tuned"]["sustained_rounds_us"], costly["tuned"]["sustained_rounds_us"]
    text = "\n".join(table.report([free, costly], "GPU", bench.SEED))
    assert "at least 60% on 1 of 2 problems" in text and "noise" not in text


@pytest.mark.shipped_results
def test_a_report_made_away_from_the_gpu_names_it_as_its_shipped_document_does():
    import bench_common

    assert bench_common.device_of("nvidia-h200-sm90") == ("nvidia-h200-sm90", "NVIDIA H200")
    assert bench_common.device_of("nvidia-h100-80gb-hbm3-sm90")[1] == "NVIDIA H100 80GB HBM3"
    assert bench_common.device_of("no-such-gpu") == ("no-such-gpu", "no-such-gpu")
    assert bench_common.device_of("../cache/nvidia-h200-sm90")[1] == "../cache/nvidia-h200-sm90"  # (no path read)


def test_the_report_says_how_far_eager_moves_against_itself_in_latency_where_rows_timed_it():
    rows = [_row(0, ("bfloat16", "bias+silu", 2048, 9216, 2304), _figures(100.0, 98.0, 90.0), _figures(93.0, 98.0, 90.0)),
            _row(1, ("float16", "bias", 8, 9216, 2304), _figures(20.0, 21.0, 20.0), _figures(20.0, 21.0, 20.0))]
    assert "Eager against itself" not in "\n".join(table.report(rows, "GPU", bench.SEED))  # (rows before it)
    for row, (untuned, tuned) in zip(rows, ((98.0 * 1.02, 98.0 * 0.97), (21.0, 21.0 * 1.01))):
        row["untuned"]["latency_us"] = {**row["untuned"]["latency_us"], table.EAGER_AGAIN: untuned}
        row["tuned"]["latency_us"] = {**row["tuned"]["latency_us"], table.EAGER_AGAIN: tuned}
    text = "\n".join(table.report(rows, "GPU", bench.SEED))
    values = (1 / 1.02, 1 / 0.97, 1.0, 1 / 1.01)  # (eager over its second self, as a ratio's competitor over ours)
    geomean = (values[0] * values[1] * values[2] * values[3]) ** 0.25
    assert f"Eager against itself, one call at a time (the same layer timed twice under two names, 4 phases): " \
           f"{min(values):.3f} to {max(values):.3f}, geomean {geomean:.3f}." in text
    assert "| untuned | latency | eager | 2 |" in text and table.EAGER_AGAIN not in text.split("| layer |")[1]


def test_a_row_keeps_the_tune_s_own_figures_from_its_result_and_its_record(tmp_path, monkeypatch):
    """tune_figures: the kept kernel's and the fastest baseline's time and the noise from the tune's result; each
    baseline route's time from the record the tune cached in the row's own user cache."""
    from types import SimpleNamespace

    from autogemm.families import SimtConfig
    from autogemm.kernels.render import kernel_template_hash
    from autogemm.problem import Problem
    from autogemm.results.cache import Record, TuningCache

    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path))
    problem, config = Problem(512, 64, 64), SimtConfig()
    device = SimpleNamespace(slug="test-gpu-sm90")
    result = SimpleNamespace(problem=problem, device=device, time_ms=0.180, cublas_ms=0.189, noise=0.012,
                             sustained={"sm_clock_mhz": 1500, "power_w": 690, "rounds": 20})
    figures = bench.tune_figures(result)
    assert figures == {"kernel_us": pytest.approx(180.0), "baseline_us": pytest.approx(189.0), "noise": 0.012,
                       "sustained": {"sm_clock_mhz": 1500, "power_w": 690, "rounds": 20}}  # (nothing cached)
    TuningCache(shipped=False).store(Record(
        problem=problem.key, family="simt", config={k: v for k, v in config.to_dict().items() if k != "family"},
        config_name=config.name, time_ms=0.180, tflops=1.0, cublas_ms=0.189, cublas_tflops=1.0, ratio=0.189 / 0.180,
        rel_error=1e-7, template_hash=kernel_template_hash(config.template), device="Test GPU",
        baselines={"F.linear": 0.191, "cuBLASLt #2": 0.189}), device.slug)
    assert bench.tune_figures(result)["baselines_us"] == {"F.linear": pytest.approx(191.0),
                                                          "cuBLASLt #2": pytest.approx(189.0)}


def test_the_report_sets_a_kept_kernel_s_served_time_beside_its_tune_s_own():
    rows = [_row(0, ("float16", "bias", 1536, 7168, 5120), _figures(189.0, 189.1, 181.2), _figures(188.4, 190.3, 182.0),
                 kept=False),
            _row(1, ("bfloat16", "bias+silu", 2048, 9216, 2304), _figures(100.0, 98.0, 90.0), _figures(93.0, 98.0, 90.0),
                 kept=False),
            _row(2, ("float16", "bias", 8, 9216, 2304), _figures(20.0, 21.0, 20.0), _figures(20.0, 21.0, 20.0))]
    assert "its tune timed it" not in "\n".join(table.report(rows, "GPU", bench.SEED))  # (rows of before the figures)
    kept = "hopper_128x224x64_w64x224_s3_g8_k1_o1_p_ts_pl_hd"
    rows[0]["tune"].update(kernel_us=181.4, baseline_us=189.0, sustained={"rounds": 20}, config=kept)
    assert table.served_over_tuned(rows[0]) is None  # (served by something else: "cuBLAS")
    rows[0]["tuned"]["served"] = f"cublas with fused {kept} (tuned with the epilogue) (C++ memo)"
    rows[1]["tune"].update(kernel_us=94.0, baseline_us=98.0, sustained={})  # (timed in short re-timings only)
    rows[2]["tune"].update(kernel_us=19.0, baseline_us=20.0, sustained={"rounds": 20})  # (cuBLAS kept)
    assert table.served_over_tuned(rows[0]) == pytest.approx(188.4 / 181.4)
    assert table.served_over_tuned(rows[1]) is None and table.served_over_tuned(rows[2]) is None
    text = "\n".join(table.report(rows, "GPU", bench.SEED))
    assert f"Where a tune kept a kernel timed sustained (1 layer), the served layer took {188.4 / 181.4:.3f} to " \
           f"{188.4 / 181.4:.3f}x the tune's own time of that kernel" in text
    assert f"| kernel 0.900x, served in {188.4 / 181.4:.3f}x its time | cublas with fused {kept} " in text


def test_single_calls_are_also_compared_paired_by_round():
    """paired_latency: the median over rounds of each competitor's call over autogemm's in the same round (against
    cuBLASLt, autogemm with its GELU form), and eager's over eager again's. Calls in two modes (48 or 54 us) put
    eager's median in one and eager again's in the other, a ratio of medians of 1.125 between the same calls;
    paired, most rounds find both alike, and the median ratio is 1."""
    ours = [10.0, 20.0, 10.0, 20.0, 10.0, 20.0, 10.0, 20.0, 10.0]
    latency = {table.AUTOGEMM: ours, table.AUTOGEMM_TANH: [t * 0.9 for t in ours],
               table.EAGER: [t * 1.1 for t in ours], table.CUBLASLT: [t * 0.99 for t in ours],
               table.GEMM_ALONE: [t * 0.95 for t in ours]}
    paired = bench.paired_latency(latency)
    assert paired["latency_paired"] == {table.EAGER: pytest.approx(1.1), table.CUBLASLT: pytest.approx(1.1),
                                        table.GEMM_ALONE: pytest.approx(0.95)}
    assert "latency_paired_floor" not in paired  # (eager was not timed again)
    eager, again = [48.0] * 4 + [54.0] * 5, [48.0] * 5 + [54.0] * 4  # (rounds: 4 alike at 48, 1 apart, 4 alike at 54)
    paired = bench.paired_latency({table.AUTOGEMM: [50.0] * 9, table.EAGER: eager, table.EAGER_AGAIN: again})
    assert paired["latency_paired_floor"] == 1.0
    assert sorted(eager)[4] / sorted(again)[4] == pytest.approx(1.125)  # (the ratio of the medians)


def test_the_report_sets_the_paired_latency_beside_the_ratio_of_medians_where_rows_kept_it():
    rows = [_row(0, ("bfloat16", "bias+silu", 2048, 9216, 2304), _figures(100.0, 98.0, 90.0), _figures(93.0, 98.0, 90.0)),
            _row(1, ("float16", "bias", 8, 9216, 2304), _figures(20.0, 21.0, 20.0), _figures(20.0, 21.0, 20.0))]
    for row in rows:
        for phase in ("untuned", "tuned"):
            row[phase]["latency_us"] = {**row[phase]["latency_us"], table.EAGER_AGAIN: 21.0}
    assert "Paired by round" not in "\n".join(table.report(rows, "GPU", bench.SEED))  # (rows of before it)
    for row, floors, against in zip(rows, ((0.99, 1.01), (1.0, 1.02)), ((0.97, 1.05), (1.01, 1.03))):
        for phase, floor, ratio in zip(("untuned", "tuned"), floors, against):
            row[phase].update(latency_paired={table.EAGER: ratio}, latency_paired_floor=floor)
    text = "\n".join(table.report(rows, "GPU", bench.SEED))
    assert "Paired by round instead (the median of each round's ratio, the calls of a round adjacent in time): eager " \
           f"against itself 0.990 to 1.020 over 4 phases; untuned {(0.97 * 1.01) ** 0.5:.3f}x eager (min 0.970, 2 " \
           f"problems); tuned {(1.05 * 1.03) ** 0.5:.3f}x eager (min 1.030, 2 problems)." in text
