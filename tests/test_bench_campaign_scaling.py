"""benchmarks/bench_campaign_scaling.py without a GPU: the slice it times (the "wider evidence" section
of campaigns/shipped.toml, as a campaign of its own) and its reading of a campaign's log."""

from __future__ import annotations

from pathlib import Path

from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent


bench = load_script(ROOT / "benchmarks" / "bench_campaign_scaling.py")


def test_the_slice_is_the_shipped_campaigns_wider_evidence_with_ten_seconds_each(tmp_path):
    from autogemm.campaigns.file import load_campaign

    campaign = load_campaign(bench.campaign_file(tmp_path, [0, 1]))
    shipped = {p.key for p in load_campaign(ROOT / "campaigns" / "shipped.toml").problems}
    keys = [p.key for p in campaign.problems]
    assert len(keys) == len(set(keys)) >= 30 and set(keys) <= shipped
    assert campaign.tune_options.timeout >= 10 and campaign.tune_options.patience == 0
    assert list(campaign.devices) == [0, 1] and campaign.cache_dir == str(tmp_path / "cache")
    assert campaign.storage == f"journal:///{tmp_path / 'studies.log'}"  # (SQLite makes two workers wait)
    assert {p.trans_b for p in campaign.problems} == {True, False} and any(p.trans_a for p in campaign.problems)
    assert any(p.batch > 1 for p in campaign.problems) and any(p.compute == "tf32" for p in campaign.problems)


def test_tune_seconds_reads_each_problems_tuning_and_done_lines():
    log = "\n".join([
        "campaign scaling: 3 problems on 2 GPU(s)",
        "23:59:58 GPU0: NVIDIA H100 80GB HBM3 ready",
        "23:59:58 GPU0: tuning float16/fp32/nt/b1/4x4096x4096",
        "23:59:59 GPU1: tuning float32/fp32/nn/b8/512x512x512",
        "00:00:12 GPU0: done float16/fp32/nt/b1/4x4096x4096: gemv_m2 8.0 TFLOP/s, 0.998x cuBLAS (kept cuBLAS)",
        "00:00:13 GPU1: helping float16/fp32/nt/b1/4x4096x4096",
        "00:00:20 GPU1: done float32/fp32/nn/b8/512x512x512: 64x64 1.0 TFLOP/s, 1.1x cuBLAS",
        "00:00:21 GPU0: tuning float64/fp64/nn/b1/384x384x384",
    ])
    assert bench.tune_seconds(log) == {"float16/fp32/nt/b1/4x4096x4096": ("GPU0", 14),
                                       "float32/fp32/nn/b8/512x512x512": ("GPU1", 21)}


def test_a_warm_run_without_the_fill_run_is_refused(tmp_path, monkeypatch, capsys):
    import pytest

    class Gpu:
        name = "NVIDIA H100 80GB HBM3"

    import autogemm.campaigns.campaign as campaign

    monkeypatch.setattr(campaign, "list_gpus", lambda: [Gpu(), Gpu()])
    with pytest.raises(SystemExit):
        bench.main(["--root", str(tmp_path), "--runs", "two-gpus"])
    assert "'fill' run first" in capsys.readouterr().err
