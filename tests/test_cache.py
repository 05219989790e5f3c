"""The tuned-results cache: concurrent writers lose nothing, corruption is set aside, stale
records are ignored, export and import round-trip."""

from __future__ import annotations

import json
import multiprocessing
import warnings

import pytest

from autogemm.cache import CacheWarning, Record, TuningCache
from autogemm.families import SimtConfig
from autogemm.problem import Problem
from autogemm.render import kernel_template_hash

SLUG = "test-gpu-sm90"


def make_record(m: int, ratio: float = 1.0, stale: bool = False) -> Record:
    config = SimtConfig()
    return Record(
        problem=Problem(m, 64, 64).key, family="simt",
        config={k: v for k, v in config.to_dict().items() if k != "family"}, config_name=config.name,
        time_ms=1.0, tflops=1.0, cublas_ms=ratio, cublas_tflops=1.0 / ratio, ratio=ratio, rel_error=1e-7,
        template_hash="0" * 16 if stale else kernel_template_hash(config.template), device="Test GPU",
    )


def _writer(directory: str, worker: int) -> None:
    cache = TuningCache(directory, shipped=False)
    for i in range(50):
        cache.store(make_record(1000 * (worker + 1) + i), SLUG)


def test_four_processes_writing_fifty_entries_each_lose_nothing(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    entries = TuningCache(tmp_path, shipped=False).document(SLUG)["entries"]
    assert len(entries) == 200
    for w in range(4):
        for i in range(50):
            assert Problem(1000 * (w + 1) + i, 64, 64).key in entries


@pytest.mark.parametrize("content", ['{"format": 1, "entries": {"float32/fp', "garbage \x00\x01", "[1, 2, 3]",
                                     '{"format": 1, "device": "x", "entries": {"not a key": {}}}'])
def test_corrupt_file_is_moved_aside_with_a_warning(tmp_path, content):
    cache = TuningCache(tmp_path, shipped=False)
    path = cache.path(SLUG)
    path.write_text(content)
    with pytest.warns(CacheWarning, match="is corrupt"):
        assert cache.lookup(Problem(64, 64, 64), SLUG) is None
    assert not path.exists()
    aside = list(tmp_path.glob(f"{SLUG}.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == content
    cache.store(make_record(64), SLUG)  # rebuilt from scratch
    assert cache.lookup(Problem(64, 64, 64), SLUG) is not None


def test_stale_template_hash_is_ignored_but_listed(tmp_path):
    cache = TuningCache(tmp_path, shipped=False)
    cache.store(make_record(64, stale=True), SLUG)
    assert cache.lookup(Problem(64, 64, 64), SLUG) is None
    ((source, record),) = cache.records(SLUG)
    assert record.stale


def test_user_entry_wins_over_shipped_and_shipped_is_read_after(tmp_path):
    shipped = tmp_path / "shipped"
    TuningCache(shipped, shipped=False).store(make_record(64, ratio=0.5), SLUG)
    TuningCache(shipped, shipped=False).store(make_record(128, ratio=0.7), SLUG)
    cache = TuningCache(tmp_path / "user", shipped=shipped)
    cache.store(make_record(64, ratio=0.9), SLUG)
    record, source = cache.lookup(Problem(64, 64, 64), SLUG)
    assert (source, record.ratio) == ("user", 0.9)
    record, source = cache.lookup(Problem(128, 64, 64), SLUG)
    assert (source, record.ratio) == ("shipped", 0.7)


def test_store_keeps_the_better_ratio(tmp_path):
    cache = TuningCache(tmp_path, shipped=False)
    cache.store(make_record(64, ratio=1.1), SLUG)
    cache.store(make_record(64, ratio=0.8), SLUG)
    assert cache.lookup(Problem(64, 64, 64), SLUG)[0].ratio == 1.1
    cache.store(make_record(64, ratio=0.8), SLUG, keep_better=False)
    assert cache.lookup(Problem(64, 64, 64), SLUG)[0].ratio == 0.8


def test_export_import_round_trip(tmp_path):
    source = TuningCache(tmp_path / "a", shipped=False)
    for m in (64, 96, 128):
        source.store(make_record(m), SLUG)
    bundle = tmp_path / "bundle.json"
    assert source.export(bundle) == 3
    target = TuningCache(tmp_path / "b", shipped=False)
    assert target.import_bundle(bundle) == 3
    assert len(target.document(SLUG)["entries"]) == 3
    with pytest.raises(ValueError, match="not an autogemm cache export"):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"hello": 1}))
        target.import_bundle(bad)


def test_writes_leave_no_temporary_files(tmp_path):
    cache = TuningCache(tmp_path, shipped=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.store(make_record(64), SLUG)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{SLUG}.json", f"{SLUG}.json.lock"]


def test_records_of_earlier_versions_still_load(tmp_path):
    """A tensor-core record as autogemm wrote it before the `instruction` knob (two booleans) and
    before records carried their kernel template's hash: it loads, reads as the same config, and
    is stale (its templates have changed since), so lookups pass it over and listings show it."""
    old = {"problem": "float16/fp32/nn/b1/4096x4096x4096", "family": "wmma",
           "config": {"bm": 256, "bn": 128, "bk": 64, "wm": 256, "wn": 64, "vec": 8, "stages": 4, "smem": "pad",
                      "group_m": 8, "split_k": 1, "min_blocks": 1, "mma": False, "wgmma": True},
           "config_name": "wmma_256x128x64_w256x64_v8_s4_pad_g8_k1_o1_wgmma", "time_ms": 0.23, "tflops": 598.5,
           "cublas_ms": 0.19, "cublas_tflops": 733.9, "ratio": 0.816, "rel_error": 1e-4,
           "template_hash": "6c3bd6f9a2c0e8d1", "device": "NVIDIA H100 80GB HBM3", "versions": {"autogemm": "0.1.0"},
           "date": "2026-11-22T10:00:00+00:00", "trials": {"valid": 150}, "wall_s": 40.0, "study": "x",
           "provisional": False}
    path = TuningCache(tmp_path, shipped=False).path(SLUG)
    path.write_text(json.dumps({"format": 1, "device": SLUG, "entries": {old["problem"]: old}}))
    cache = TuningCache(tmp_path, shipped=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not reported as corrupt
        ((source, record),) = cache.records(SLUG)
    assert record.config_object.name == old["config_name"] and record.config_object.instruction == "wgmma"
    assert record.stale
    assert cache.lookup(Problem.from_key(old["problem"]), SLUG) is None
