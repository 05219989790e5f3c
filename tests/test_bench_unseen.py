"""benchmarks/bench_unseen.py without a GPU: the seeded generator of unseen problems (how many, what
mix, none known, within bounds) and --list, which needs neither a GPU nor CuPy."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_unseen.py"


bench = load_script(SCRIPT)


@pytest.fixture(scope="module")
def problems():
    return bench.unseen_problems(bench.SEED)


def test_enough_problems_the_same_for_a_seed_and_another_for_another(problems):
    assert len(problems) == bench.COUNT >= 200
    assert bench.unseen_problems(bench.SEED) == problems
    assert bench.unseen_problems(7) != problems
    assert len({bench._problem(spec).key for spec in problems}) == len(problems)  # none twice


def test_known_keys_cover_what_is_shipped():
    known = bench.known_keys()
    entries = json.loads((ROOT / "cache" / "nvidia-h100-80gb-hbm3-sm90.json").read_text())["entries"]
    assert entries and set(entries) <= known
    assert "float16/fp32/nt/b1/16x4096x4096" in known  # bench_baselines.SHAPES
    assert "float64/fp64/nn/b1/511x513x257" in known  # benchmarks/shapes.toml
    from autogemm.campaigns.file import load_campaign

    assert {p.key for p in load_campaign(ROOT / "campaigns" / "shipped.toml").problems} <= known


def test_the_suite_is_the_one_the_published_results_measured(problems):
    """Adding problems to a campaign or records to cache/ must not change the suite (a known key that
    the generator would have drawn makes it draw again, and every later draw moves): the figures of
    a re-run are comparable with the published ones only on the same problems."""
    for path in sorted((ROOT / "benchmarks" / "results").glob("unseen-*.json")):
        published = json.loads(path.read_text())
        if published.get("seed") != bench.SEED or published.get("count") != bench.COUNT:
            continue
        assert [tuple(row["spec"]) for row in published["rows"]] == problems, path.name


@pytest.mark.parametrize("seed", [bench.SEED, 7])
def test_no_problem_is_known(seed):
    known = bench.known_keys()
    assert not [spec for spec in bench.unseen_problems(seed) if bench._problem(spec).key in known]


def test_the_mix(problems):
    modes = collections.Counter(bench.mode_name(spec) for spec in problems)
    assert set(modes) == {"float32", "tf32", "float16", "bfloat16", "float64"}
    assert min(modes.values()) >= 25, modes
    assert {"nn", "nt", "tn"} <= {spec[2] for spec in problems}
    assert any(spec[3] > 1 for spec in problems)
    ms, ks = [spec[4] for spec in problems], [spec[6] for spec in problems]
    assert min(ms) == 1 and 4096 <= max(ms) <= 8192
    assert min(ks) <= 64 and 16384 <= max(ks) <= 32768 and min(ks) >= 16
    assert any(spec[5] == 1 for spec in problems)  # one column
    assert sum(spec[4] <= 32 for spec in problems) >= 20  # decode-sized M favoured
    # LLM widths in FP16/BF16, NT among them
    assert any(spec[0] in ("float16", "bfloat16") and spec[2] == "nt" and spec[5] in (11008, 14336, 28672)
               for spec in problems)


@pytest.mark.parametrize("seed", [bench.SEED, 7, 11])
def test_flop_and_memory_bounds_hold(seed):
    itemsize = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
    for dtype, compute, layout, batch, m, n, k in bench.unseen_problems(seed):
        limit = 2e11 if (dtype, compute) in (("float32", "fp32"), ("float64", "fp64")) else 2e12
        assert 2 * m * n * k * batch <= limit, (dtype, compute, layout, batch, m, n, k)
        assert itemsize[dtype] * batch * (m * k + k * n + m * n) <= 1.5e9, (dtype, compute, layout, batch, m, n, k)


def test_within_bounds_refuses_what_is_too_large():
    assert not bench.within_bounds(("float32", "fp32", "nn", 1, 8192, 4096, 4096))  # 2.7e11 flops
    assert bench.within_bounds(("float16", "fp32", "nn", 1, 8192, 4096, 4096))
    assert not bench.within_bounds(("float16", "fp32", "nn", 1, 1, 28672, 32768))  # 1.9 GB of B


def test_list_runs_without_a_gpu():
    done = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == bench.COUNT
    only = subprocess.run([sys.executable, str(SCRIPT), "--list", "--only", "tf32 "], capture_output=True, text=True,
                          timeout=120)
    assert only.returncode == 0 and only.stdout and all(" tf32 " in line for line in only.stdout.splitlines())


def test_list_imports_no_cupy():
    script = (f"import importlib.util, sys; spec = importlib.util.spec_from_file_location('b', {str(SCRIPT)!r}); "
              "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.main(['--list']); "
              "assert not [n for n in sys.modules if n.split('.')[0] in ('cupy', 'torch')], 'GPU import'")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_per_dtype_table_has_every_mode_and_all():
    rows = [{"mode": mode, "ratio": ratio, "generated": generated}
            for mode, ratio, generated in [("float16", 2.0, True), ("float16", 0.5, False), ("tf32", 1.0, True)]]
    lines = bench.summary(rows)
    assert lines[2].startswith("| float16 | 2 | 1.000 |") and lines[2].endswith("| 0.500 | 1 |")
    assert lines[3].startswith("| tf32 | 1 |") and lines[-1] == "| all | 3 | 1.000 | 0.550 | 0.500 | 2 |"


def test_the_sustained_table_has_each_path_against_its_baseline():
    rows = [{"sustained_ratio": 1.02, "sustained_tensor_ratio": 0.99}, {"sustained_ratio": 0.98},
            {"ratio": 1.0}]  # (the last was not timed sustained: under 50 us)
    lines = bench.sustained_summary(rows)
    assert "back to back in 20 random-order rounds" in lines[0]  # (rows of before the rounds were recorded: 20)
    assert "| CuPy arrays | 2 | 1.000 | 0.980 |" in lines  # (sqrt(1.02 x 0.98))
    assert "| PyTorch tensors | 1 | 0.990 | 0.990 |" in lines
    assert bench.sustained_summary([{"ratio": 1.0}]) == []


def test_sustained_rounds_default_to_the_tunes_and_are_said_in_the_table():
    from autogemm.measure import timing

    assert bench.SUSTAINED_ROUNDS == timing.SUSTAINED_ROUNDS
    lines = bench.sustained_summary([{"sustained_ratio": 1.0, "sustained_rounds": 40}])
    assert "back to back in 40 random-order rounds" in lines[0]


@pytest.mark.parametrize("value", ["-1", "1001", "many"])
def test_a_number_of_sustained_rounds_out_of_range_is_refused(value):
    done = subprocess.run([sys.executable, str(SCRIPT), "--list", "--sustained", value], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "--sustained" in done.stderr


def _noisy_rounds(rng, means, rounds=20, spread=0.015):
    return {name: [mean * (1 + rng.gauss(0, spread)) for _ in range(rounds)] for name, mean in means.items()}


def test_the_faster_baseline_is_picked_on_other_rounds_than_the_ratio_is_taken_on():
    """Three competitors that run one kernel: the cross-fitted ratio is 1 on average, where the faster of the two
    baselines' means over the same rounds measures below 1 (the bias that made the CuPy path's geomean 0.997)."""
    import random
    import statistics

    rng = random.Random(3)
    same = {"autogemm.matmul": 1.0, "torch.matmul": 1.0, "cupy.matmul": 1.0}
    draws = [_noisy_rounds(rng, same) for _ in range(400)]
    crossfit = statistics.fmean(bench.faster_baseline_ratio(r, ["torch.matmul", "cupy.matmul"], "autogemm.matmul")
                                for r in draws)
    naive = statistics.fmean(min(statistics.fmean(r["torch.matmul"]), statistics.fmean(r["cupy.matmul"]))
                             / statistics.fmean(r["autogemm.matmul"]) for r in draws)
    assert abs(crossfit - 1) < 0.001 and naive < 0.9985
    # a baseline clearly faster is the one every half picks: the ratio is the means'
    apart = _noisy_rounds(rng, {"autogemm.matmul": 1.0, "torch.matmul": 0.9, "cupy.matmul": 1.1})
    assert bench.faster_baseline_ratio(apart, ["torch.matmul", "cupy.matmul"], "autogemm.matmul") == pytest.approx(
        statistics.fmean(apart["torch.matmul"]) / statistics.fmean(apart["autogemm.matmul"]), rel=0.003)


def test_rows_are_kept_as_they_are_measured_and_a_rerun_goes_on_from_them(tmp_path, monkeypatch):
    """--rows: each problem's row is appended at once; a rerun skips what the file holds; past the deadline
    no problem is started (a published run spread over several device calls loses nothing)."""
    measured = []

    def fake_measure(spec, rounds, gpu_time_ms, seed, sustained):
        measured.append(seed)
        return {"ratio": 1.0}

    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(bench, "_progress", lambda index, row: f"#{index}")
    monkeypatch.setattr(bench, "release_memory", lambda: None)
    path = tmp_path / "rows.jsonl"
    indexed = [(i, ("float16", "fp32", "nn", 1, 8 + i, 8, 8)) for i in range(4)]  # (four problems: rows are kept by key)
    assert [r["index"] for r in bench.measure_all(indexed[:2], 1, 0.0, rows_file=path)] == [0, 1]
    assert [r["index"] for r in bench.measure_all(indexed, 1, 0.0, rows_file=path)] == [2, 3]
    assert measured == [0, 2, 4, 6]  # (each problem once, with its own seed)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2, 3] and all(len(r["source_digest"]) == 16 for r in rows)
    assert bench.measure_all([(9, ("float16", "fp32", "nn", 1, 20, 8, 8))], 1, 0.0, rows_file=path,
                             deadline=1.0) == [] and len(measured) == 4  # (1970: past; a problem not in the file)
    bad = subprocess.run([sys.executable, str(SCRIPT), "--deadline-s", "60"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--rows" in bad.stderr
