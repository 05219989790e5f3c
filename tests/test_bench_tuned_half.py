"""benchmarks/bench_tuned_half.py without a GPU: the seeded draw (what the half-precision issue asks of it),
--list and --problem, the results file that a cut-short run leaves readable, and the table's classes."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_tuned_half.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_common  # noqa: E402
import tuned_half_table  # noqa: E402


bench = load_script(SCRIPT)


@pytest.fixture(scope="module", params=[bench.SEED, 7])
def problems(request):
    return bench.half_problems(request.param)


def test_forty_unseen_half_precision_problems_the_same_for_a_seed(problems):
    from bench_unseen import known_keys

    assert len(problems) == bench.COUNT >= 40
    keys = [bench._problem(spec).key for spec in problems]
    assert len(set(keys)) == len(keys) and not set(keys) & known_keys()
    assert bench.half_problems(bench.SEED) != bench.half_problems(7)


def test_the_mix_is_the_one_asked_for(problems):
    dtypes = collections.Counter(spec[0] for spec in problems)
    assert dtypes["bfloat16"] == dtypes["float16"] == len(problems) // 2
    layouts = collections.Counter(spec[1] for spec in problems)
    assert layouts["nt"] > len(problems) / 2 and layouts["nn"] + layouts["tn"] >= 4
    assert all(bench.K_RANGE[0] <= spec[4] <= bench.K_RANGE[1] for spec in problems)
    # every class of M, projections against widths of families no campaign names, squares
    low = 0
    for high, _ in tuned_half_table.M_CLASSES:
        assert any(low < spec[2] <= high for spec in problems), high
        low = high
    tuned = bench._campaign_widths()
    widths = {w for family in bench.FAMILIES.values() for w in family} | {2 * f[2] for f in bench.FAMILIES.values()}
    assert not any(spec[3] in tuned and spec[3] in widths for spec in problems)
    assert any(abs(spec[2] - spec[3]) < 20 and abs(spec[3] - spec[4]) < 20 for spec in problems)  # squares


def test_list_and_given_problems_run_without_a_gpu():
    listed = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, check=True)
    assert len(listed.stdout.splitlines()) == bench.COUNT
    given = subprocess.run([sys.executable, str(SCRIPT), "--list", "--problem", "bfloat16,nt,8192,8192,8192"],
                           capture_output=True, text=True, check=True)
    assert "bfloat16/fp32/nt/b1/8192x8192x8192" in given.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "--list", "--problem", "bf16,nt,1,2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "DTYPE,LAYOUT,M,N,K" in bad.stderr
    shard = subprocess.run([sys.executable, str(SCRIPT), "--list", "--shard", "0/3"], capture_output=True, text=True)
    assert shard.returncode == 2 and "--shard" in shard.stderr


def _row(m, ratio, generated, dtype="bfloat16", eager=None, digest="d1"):
    return {"spec": [dtype, "nt", m, 4096, 4096], "label": f"{dtype} nt {m}x4096x4096", "ratio": ratio,
            "eager_ratio": ratio if eager is None else eager, "source_digest": digest,
            "latency_ratio": 1.0, "generated": generated, "kept_cublas": not generated, "tune_ratio": ratio,
            "gpu_us": {bench.AUTOGEMM: 10.0, bench.TORCH: 10.0 * ratio},
            "sustained_us": {bench.AUTOGEMM: 10.0, bench.TORCH: 10.0 * ratio}, "source": "cache",
            "config": "c" if generated else None, "waves": "", "tuned_waves": "80 tiles of 128x256, 1 wave, 61% full"}


def test_a_cut_short_results_file_keeps_its_whole_rows_and_the_table_has_every_class(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [_row(256, 1.02, True, eager=0.9), _row(1024, 0.99, False), _row(4096, 1.05, True, "float16")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"spec": ["bfloat16", "nt", 5')
    assert bench_common.read_rows(path) == rows
    table = bench.report(rows, "NVIDIA H200", 7)
    # (GPU time geomean and min, eager geomean and min, latency geomean, generated kernels)
    assert "| M <= 640 | 1 | 1.020 | 1.020 | 0.900 | 0.900 | 1.000 | 1 |" in table
    assert "| M <= 2048 | 1 | 0.990 | 0.990 | 0.990 | 0.990 | 1.000 | 0 |" in table
    assert "| M > 2048 | 1 | 1.050 | 1.050 | 1.050 | 1.050 | 1.000 | 1 |" in table
    assert any(line.startswith("| all | 3 |") for line in table)
    assert not any("different codes" in line for line in table)
    assert not any("have not yet" in line for line in table)  # (no count of the draw given)
    assert "**3 of the 40 problems drawn have run; the other 37 have not yet.**" in bench.report(rows, "NVIDIA H200", 7, 40)
    assert not any("have not yet" in line for line in bench.report(rows, "NVIDIA H200", 7, 3))


def test_each_row_gives_the_noise_of_its_paired_rounds():
    # rounds of 4: torch over autogemm 1.0, 1.0, 1.2, 0.8 in the same round: mean 1.0, sample deviation
    # sqrt(0.08 / 3), standard error that over 2, noise twice it over the mean (the tune's own measure)
    rounds = {bench.AUTOGEMM: [10.0, 10.0, 10.0, 10.0], bench.TORCH: [10.0, 10.0, 12.0, 8.0]}
    row = {**_row(1024, 1.0, False), "gpu_rounds_us": rounds}
    assert tuned_half_table.paired_noise(row) == pytest.approx(2 * (0.08 / 3) ** 0.5 / 2)
    assert tuned_half_table.paired_noise(_row(256, 1.02, True)) is None  # (no rounds recorded)
    steady = {**row, "gpu_rounds_us": {bench.AUTOGEMM: [10.0] * 4, bench.TORCH: [10.0] * 4}}
    assert tuned_half_table.paired_noise(steady) == 0.01  # (the tune's least noise, timing.MIN_NOISE)
    table = bench.report([row, _row(256, 1.02, True)], "NVIDIA H200", 7)
    assert any(line.startswith("| bfloat16 nt 1024x4096x4096 | 1.000 | ±16.3% | 1.000 | 1.000 |") for line in table)
    assert any(line.startswith("| bfloat16 nt 256x4096x4096 | 1.020 |  | 1.020 |") for line in table)


def test_rows_of_two_codes_are_named_in_the_table():
    table = bench.report([_row(256, 1.02, True), _row(1024, 0.99, False, digest="d2")], "NVIDIA H200", 7)
    assert any("2 different codes" in line and "d1, d2" in line for line in table)


def test_the_source_digest_follows_the_sources(tmp_path):
    for folder in ("autogemm", "templates", "search_spaces"):
        (tmp_path / folder).mkdir()
    (tmp_path / "autogemm" / "a.py").write_text("x = 1\n")
    first = bench_common.source_digest(tmp_path)
    assert first == bench_common.source_digest(tmp_path) and len(first) == 16
    assert first != bench_common.source_digest()  # (this checkout's)
    (tmp_path / "templates" / "k.cu.j2").write_text("// kernel\n")
    second = bench_common.source_digest(tmp_path)
    assert second != first
    (tmp_path / "autogemm" / "memo.h").write_text("// linear's memo in C++\n")  # (what serves is in it too)
    assert bench_common.source_digest(tmp_path) != second


def test_the_max_autotune_rows_are_tabled_where_they_were_run():
    rows = [_row(256, 1.02, True), {**_row(1024, 1.0, False), "inductor_ratio": 1.05,
                                    "inductor_us": {"max-autotune": 10.5, "max-autotune + autogemm": 10.0}}]
    table = bench.report(rows, "NVIDIA H200", 7)
    assert "| bfloat16 nt 1024x4096x4096 | 10.5 | 10.0 | 1.050 |" in table
    assert "| geomean (1) | | | 1.050 |" in table
    assert tuned_half_table.inductor_summary(rows[:1]) == []


def test_a_draw_without_the_campaigns_and_cache_it_leaves_out_is_refused(tmp_path):
    """A copy of benchmarks/ without campaigns/ and cache/ beside it once drew other problems under the
    published seed (and measured them as that draw); it must stop and say what is missing."""
    copy = tmp_path / "benchmarks"
    copy.mkdir()
    for path in (ROOT / "benchmarks").iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    listed = subprocess.run([sys.executable, str(copy / "bench_tuned_half.py"), "--list"], capture_output=True, text=True)
    assert listed.returncode == 1 and "no cache/*.json" in listed.stderr and "whole checkout" in listed.stderr
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "d.json").write_text('{"entries": {}}')
    listed = subprocess.run([sys.executable, str(copy / "bench_tuned_half.py"), "--list"], capture_output=True, text=True)
    assert listed.returncode == 1 and "no campaigns/*.toml" in listed.stderr


def test_rows_of_another_draw_are_neither_reported_nor_added_to(tmp_path):
    drawn = bench.half_problems()
    ours = dict(_row(256, 1.0, False), index=1, spec=list(drawn[1]))
    stray = dict(_row(512, 1.0, False), index=6, spec=["bfloat16", "nt", 8192, 21888, 2048])
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ours) + "\n")
    bench_common.require_rows_of_draw(path, drawn)  # (the draw's own rows pass)
    assert bench_common.rows_outside_draw([ours, stray, dict(ours, index=40)], drawn) == [stray, dict(ours, index=40)]
    path.write_text(json.dumps(ours) + "\n" + json.dumps(stray) + "\n")
    with pytest.raises(SystemExit, match="1 rows that are not this draw's problem at their index"):
        bench_common.require_rows_of_draw(path, drawn)  # (as a run does before it adds a row)
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(path), "--report", "--device-slug", "nvidia-h200-sm90"],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "1 rows that are not this draw's" in run.stderr
    assert "#6 bfloat16 nt 512x4096x4096" in run.stderr and not path.with_suffix(".md").exists()


def test_a_file_of_given_problems_gathers_the_rows_of_several_lists(tmp_path):
    path = tmp_path / "given.jsonl"
    path.write_text(json.dumps(dict(_row(256, 1.0, False), index=0)) + "\n")  # (an earlier --problem list's)
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(path), "--report", "--device-slug", "nvidia-h200-sm90",
                          "--problem", "bfloat16,nt,8192,8192,8192"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "bfloat16 nt 256x4096x4096" in path.with_suffix(".md").read_text()


def test_the_table_says_how_many_gpu_time_rounds_its_rows_were_timed_in():
    """Rows record their rounds (gpu_rounds_us); rows from before that were timed in 20. A file of both says so."""
    def timed(m, rounds):
        return {**_row(m, 1.0, False), "gpu_rounds_us": {bench.AUTOGEMM: [10.0] * rounds, bench.TORCH: [10.0] * rounds}}

    text = "\n".join(bench.report([timed(256, 60), timed(1024, 60)], "NVIDIA H200", 7))
    assert "back to back in 60 rounds of about 50 ms" in text and "Eager: 20 such rounds" in text
    assert "in 20 to 60 rounds" in "\n".join(bench.report([timed(256, 60), _row(1024, 1.0, False)], "NVIDIA H200", 7))
    assert "in 20 rounds" in "\n".join(bench.report([_row(256, 1.0, False)], "NVIDIA H200", 7))
