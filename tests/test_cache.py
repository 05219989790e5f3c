"""The tuned-results cache: concurrent writers lose nothing, corruption is set aside, stale
records are ignored, export and import round-trip."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import warnings

import pytest

from autogemm.results.cache import CacheWarning, Record, TuningCache, check_slug
from autogemm.families import SimtConfig
from autogemm.problem import Problem
from autogemm.kernels.render import kernel_template_hash

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
                                     '{"format": 1, "entries": []}', "[" * 100000 + "]" * 100000])
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


def _bad_entries() -> dict:
    good = make_record(96).to_json()
    return {
        "float32/fp32/nn/b1/1x64x64": [1, 2],  # not an object
        "float32/fp32/nn/b1/2x64x64": {**make_record(2).to_json(), "config": {**good["config"], "bm": "128"}},
        "float32/fp32/nn/b1/3x64x64": {**make_record(3).to_json(), "config": {**good["config"], "colour": 1}},
        "float32/fp32/nn/b1/4x64x64": {**make_record(4).to_json(), "ratio": "fast"},
        "float32/fp32/nn/b1/5x64x64": {**make_record(5).to_json(), "date": 20261123},
        "float32/fp32/nn/b1/6x64x64": {**make_record(6).to_json(), "problem": "not a key"},
        "float32/fp32/nn/b1/7x64x64": {**make_record(7).to_json(), "config": {**good["config"], "group_m": 2**32}},
        "float32/fp32/nn/b1/8x64x64": {**make_record(8).to_json(), "config_name": "128x128x8_other"},
    }


def test_bad_records_are_skipped_with_one_warning_and_the_rest_served(tmp_path):
    from autogemm.serving.planning import Dispatcher
    from autogemm.problem import Device

    cache = TuningCache(tmp_path, shipped=False)
    cache.store(make_record(96), SLUG)
    document = json.loads(cache.path(SLUG).read_text())
    document["entries"].update(_bad_entries())
    cache.path(SLUG).write_text(json.dumps(document))
    with pytest.warns(CacheWarning, match=r"skipped 8 bad record\(s\): '.*1x64x64' \(a record must be an object") as caught:
        assert [r.problem for _, r in cache.records(SLUG)] == [Problem(96, 64, 64).key]
    assert len(caught) == 1 and str(cache.path(SLUG)) in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # a lookup reads only its own problem's record
        assert cache.lookup(Problem(96, 64, 64), SLUG) is not None
    with pytest.warns(CacheWarning, match=r"skipped 1 bad record\(s\): '.*4x64x64' \(ratio must be a positive"):
        assert cache.lookup(Problem(4, 64, 64), SLUG) is None
    # the file is kept (nothing of it lost), and selection for any problem keeps working
    assert len(json.loads(cache.path(SLUG).read_text())["entries"]) == 9
    device = Device(name="Test GPU", compute_capability=(9, 0), sm_count=132, smem_per_block_optin=227 * 1024,
                    smem_per_sm=228 * 1024)
    assert device.slug == SLUG
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        for m in range(1, 9):
            choice = Dispatcher(cache).select(Problem(m, 64, 64), device, tune=False)
            assert choice.source in ("predicted", "cublas")
    cache.store(make_record(97), SLUG)  # a store keeps the entries it cannot read
    assert len(json.loads(cache.path(SLUG).read_text())["entries"]) == 10


@pytest.mark.parametrize("slug", ["../../x/y", "/tmp/abs", "a/b", "UPPER", "-lead", "", "x..y", 42])
def test_device_names_are_file_names_only_in_slug_form(slug):
    with pytest.raises(ValueError, match="not a device name autogemm writes"):
        check_slug(slug)
    with pytest.raises(ValueError, match="not a device name autogemm writes"):
        TuningCache("/nonexistent").path(slug)


def test_an_import_naming_a_path_is_refused_and_writes_nothing(tmp_path):
    outside = tmp_path / "x"
    outside.mkdir()
    (outside / "y.json").write_text('{"precious": true}')
    record = make_record(64).to_json()
    for slug in ("../../x/y", str(outside / "z")):
        bundle = tmp_path / "bundle.json"
        bundle.write_text(json.dumps({"format": 1, "devices": {
            SLUG: {"format": 1, "device": SLUG, "entries": {record["problem"]: record}},
            slug: {"format": 1, "device": slug, "entries": {record["problem"]: record}}}}))
        cache = TuningCache(tmp_path / "cache" / "tuned", shipped=False)
        with pytest.raises(ValueError, match="not a device name autogemm writes.*nothing imported"):
            cache.import_bundle(bundle)
    assert sorted(p.name for p in outside.iterdir()) == ["y.json"]
    assert (outside / "y.json").read_text() == '{"precious": true}'
    assert not (tmp_path / "cache").exists()  # not even the good device's document


def test_an_import_with_a_bad_record_writes_nothing(tmp_path):
    good = make_record(64).to_json()
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps({"format": 1, "devices": {SLUG: {"format": 1, "device": SLUG, "entries": {
        good["problem"]: good, "float32/fp32/nn/b1/4x64x64": _bad_entries()["float32/fp32/nn/b1/4x64x64"]}}}}))
    cache = TuningCache(tmp_path / "cache", shipped=False)
    with pytest.raises(ValueError, match="bad record.*4x64x64.*ratio must be a positive number.*nothing imported"):
        cache.import_bundle(bundle)
    assert not (tmp_path / "cache").exists()


def test_a_read_only_cache_serves_read_only(tmp_path, monkeypatch):
    cache = TuningCache(tmp_path, shipped=False)
    cache.store(make_record(64), SLUG)

    def read_only(self, device_slug):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(TuningCache, "_lock", read_only)
    assert cache.lookup(Problem(64, 64, 64), SLUG) is not None  # reads take no lock
    assert len(cache.records(SLUG)) == 1
    with pytest.raises(OSError, match="Read-only file system"):
        cache.store(make_record(65), SLUG)


def test_files_are_shared_0644(tmp_path):
    cache = TuningCache(tmp_path, shipped=False)
    cache.store(make_record(64), SLUG)
    assert cache.path(SLUG).stat().st_mode & 0o777 == 0o644


def test_a_full_disk_leaves_the_document_and_no_temporary_file(tmp_path, monkeypatch):
    cache = TuningCache(tmp_path, shipped=False)
    cache.store(make_record(64), SLUG)
    before = cache.path(SLUG).read_text()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        cache.store(make_record(65), SLUG)
    assert cache.path(SLUG).read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{SLUG}.json", f"{SLUG}.json.lock"]


@pytest.mark.parametrize("field,value,message", [
    ("config", {"family": [[[]]]}, "config must not name a family"),
    ("versions", {"cupy": [[["14.2"]]]}, "versions.cupy must be a string"),
    ("trials", {"valid": {"deep": 1}}, r"trials.valid must be a count"),
    ("trials", {"failed": -1}, r"trials.failed must be a count"),
])
def test_a_record_carries_no_unchecked_structure(field, value, message):
    """What a record keeps is written back by every export and listing: a nested value in a field
    read as a whole (found by the cache fuzzer: a junk "family" inside the config) is refused on reading."""
    data = make_record(64).to_json()
    data[field] = {**data[field], **value}
    with pytest.raises(ValueError, match=message):
        Record.from_json(data)
    assert Record.from_json(make_record(64).to_json()).config_object == SimtConfig()


def test_every_shipped_record_measured_the_kernel_the_templates_render_today():
    """A template edit that changes a shipped kernel's source, even by a blank line, makes its record
    stale, and stale records are neither served nor learnt from: such an edit must come with the
    records measured again (`autogemm cache retime`), or it silently takes the records out of use."""
    from autogemm.paths import shipped_cache_dir

    shipped = shipped_cache_dir()
    assert shipped is not None
    documents = sorted(shipped.glob("*.json"))
    assert documents, f"no shipped documents in {shipped}"
    cache = TuningCache(shipped, shipped=False)
    for document in documents:
        records = list(cache.records(document.stem))
        stale = [record.problem for _, record in records if record.stale]
        assert len(records) >= 150 and not stale, (document.name, len(records), stale[:5], len(stale))
