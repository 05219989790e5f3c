"""The cache against crafted inputs and rude interruptions (issue 36): an import writes each device's
document once, all or nothing, fast; a killed import or merge leaves the old or the new document
and its temporary files are cleaned by the next write; device names too long for a file name, a
read-only cache, records nested without end, duplicate keys and figures no GPU can reach are
refused with a message that names them; `autogemm cache ACTION` takes only its own flags."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from autogemm.results.cache import CacheWarning, Record, TuningCache, check_slug
from autogemm.results.merge import merge_files
from autogemm.cli import main
from autogemm.problem import Problem
from autogemm.kernels.render import kernel_digest

from test_cache import SLUG, make_record

OTHER = "other-gpu-sm90"


def _entries(count: int, first: int = 1) -> dict:
    """`count` valid records of problems first x 64 x 64 ... (one record copied: building each would
    render its kernel)."""
    template = make_record(64).to_json()
    entries = {}
    for m in range(first, first + count):
        key = Problem(m, 64, 64).key
        entries[key] = {**template, "problem": key}
    return entries


def _bundle(path: Path, documents: dict[str, dict]) -> Path:
    path.write_text(json.dumps({"format": 1, "devices": {
        slug: {"format": 1, "device": slug, "entries": entries} for slug, entries in documents.items()}}))
    return path


def _temporary_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if ".tmp" in p.name)


# ---- an import: one write per device, fast, all or nothing --------------------------------------
def test_an_import_of_3000_records_writes_each_document_once_and_fast(tmp_path, monkeypatch):
    bundle = _bundle(tmp_path / "bundle.json", {SLUG: _entries(2500), OTHER: _entries(500)})
    cache = TuningCache(tmp_path / "cache", shipped=False)
    cache.store(make_record(1, ratio=5.0), SLUG)  # a better record already there is kept
    calls = []
    real_fsync = os.fsync

    def counted(fd):  # the file and its directory, once per device
        calls.append(fd)
        assert len(calls) <= 4, "the import wrote a document more than once per device"
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counted)
    started = time.perf_counter()
    assert cache.import_bundle(bundle) == 3000
    assert time.perf_counter() - started < 15
    assert len(cache.document(SLUG)["entries"]) == 2500 and len(cache.document(OTHER)["entries"]) == 500
    assert cache.document(SLUG)["entries"][Problem(1, 64, 64).key]["ratio"] == 5.0
    assert _temporary_files(cache.directory) == []


CHILD = r"""
import os, sys, time
action, pause_at, target, source = sys.argv[1:]
calls = [0]
real = os.fsync
def fsync(fd):
    calls[0] += 1
    if calls[0] == int(pause_at):  # where the parent kills it
        print("paused", flush=True)
        time.sleep(120)
    real(fd)
os.fsync = fsync
if action == "import":
    from autogemm.results.cache import TuningCache
    TuningCache(target, shipped=False).import_bundle(source)
else:
    from autogemm.results.merge import merge_files
    merge_files([source], target)
print("done", flush=True)
"""


def _run_and_kill(action: str, pause_at: int, target: Path, source: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, action, str(pause_at), str(target), str(source)],
                             stdout=subprocess.PIPE, cwd=Path(__file__).parent)
    try:
        line = child.stdout.readline().strip()
        assert line in (b"paused", b"done"), line
        if line == b"paused":
            child.send_signal(signal.SIGKILL)
    finally:
        child.wait(60)
        child.stdout.close()


@pytest.mark.parametrize("pause_at", [1, 2])
def test_a_killed_import_leaves_the_old_or_the_new_document_and_its_temporary_files_go(tmp_path, pause_at):
    cache = TuningCache(tmp_path / "cache", shipped=False)
    cache.store(make_record(1), SLUG)
    old = set(cache.document(SLUG)["entries"])
    new = old | set(_entries(40, first=100))
    _run_and_kill("import", pause_at, cache.directory, _bundle(tmp_path / "bundle.json", {SLUG: _entries(40, first=100)}))
    assert set(cache.document(SLUG)["entries"]) in (old, new)
    cache.store(make_record(2), SLUG)  # the next write removes what the killed one left
    assert _temporary_files(cache.directory) == []


def test_a_killed_merge_leaves_no_orphan_after_the_next_merge(tmp_path):
    source = _bundle(tmp_path / "bundle.json", {SLUG: _entries(40)})
    out = tmp_path / "out" / "merged.json"
    out.parent.mkdir()
    _run_and_kill("merge", 1, out, source)
    assert not out.exists()
    merge_files([source], out)
    assert len(json.loads(out.read_text())["entries"]) == 40
    assert _temporary_files(out.parent) == []


def test_a_failed_write_of_a_later_device_names_the_devices_written(tmp_path, monkeypatch):
    bundle = _bundle(tmp_path / "bundle.json", {SLUG: _entries(3), OTHER: _entries(2)})
    cache = TuningCache(tmp_path / "cache", shipped=False)
    real_replace = os.replace

    def full_for_the_second(src, dst):
        if Path(dst).name == f"{SLUG}.json":  # (devices are written in name order: OTHER first)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_for_the_second)
    with pytest.raises(OSError, match=rf"wrote .*{OTHER}.*{SLUG}.*not written.*No space left"):
        cache.import_bundle(bundle)
    assert len(cache.document(OTHER)["entries"]) == 2
    assert cache.document(SLUG)["entries"] == {}
    assert _temporary_files(cache.directory) == []


def test_a_device_name_too_long_for_a_file_name_is_refused_before_anything_is_written(tmp_path):
    long_name = "a" * 300
    with pytest.raises(ValueError, match="not a device name autogemm writes"):
        check_slug(long_name)
    bundle = _bundle(tmp_path / "bundle.json", {SLUG: _entries(2), long_name: _entries(2)})
    cache = TuningCache(tmp_path / "cache", shipped=False)
    with pytest.raises(ValueError, match="not a device name autogemm writes.*nothing imported"):
        cache.import_bundle(bundle)
    assert not (tmp_path / "cache").exists()


def test_importing_into_a_read_only_cache_says_which_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "ro"))
    directory = tmp_path / "ro" / "tuned"
    directory.mkdir(parents=True)
    bundle = _bundle(tmp_path / "bundle.json", {SLUG: _entries(2)})
    real_open, real_mkdir = os.open, os.mkdir

    def read_only_open(path, flags, *args, **kwargs):  # a read-only mount, as root sees it too
        if str(path).startswith(str(directory)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    def read_only_mkdir(path, *args, **kwargs):
        if str(path).startswith(str(directory)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_open)
    monkeypatch.setattr(os, "mkdir", read_only_mkdir)
    assert main(["cache", "import", str(bundle)]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(directory) in err and "Read-only file system" in err
    assert "nothing imported" in err
    assert main(["cache", "clear", "--yes"]) in (0, 3)  # nothing to clear, or said so: no traceback


# ---- what a document may hold ------------------------------------------------------------------
def _nested(depth: int):
    value = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [600, 900])
def test_a_record_nested_without_end_is_refused_everywhere(tmp_path, monkeypatch, capsys, depth):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "home"))
    entries = _entries(2)
    key = next(iter(entries))
    text = json.dumps(_nested(depth))  # (json.dumps would recurse as deep as the nesting)
    document = json.dumps({"format": 1, "device": SLUG, "entries": entries})
    crafted = document.replace(f'"problem": "{key}"', f'"problem": "{key}", "best_generated": {{"x": {text}}}', 1)
    source = tmp_path / "crafted.json"
    source.write_text(crafted)
    with pytest.raises(ValueError, match="nested deeper than"):
        TuningCache(tmp_path / "cache", shipped=False).import_bundle(source)
    with pytest.raises(ValueError, match="nested deeper than"):
        merge_files([source], tmp_path / "merged.json")
    # the same document as a cache's own: set aside with a warning, and every command goes on
    tuned = tmp_path / "home" / "tuned"
    tuned.mkdir(parents=True)
    for argv in (["cache", "list"], ["cache", "list", "--json"], ["cache", "show", key],
                 ["cache", "export", "-o", str(tmp_path / "x.json")], ["cache", "import", str(source)],
                 ["cache", "merge", str(source), "-o", str(tmp_path / "m.json")]):
        (tuned / f"{SLUG}.json").write_text(crafted)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main(argv) in (0, 2, 3), argv
        if argv[1] in ("list", "show", "export"):
            assert any("nested deeper than" in str(w.message) for w in caught), argv
    assert "RecursionError" not in capsys.readouterr().err


def test_best_generated_is_checked_like_the_rest_of_a_record():
    generated = make_record(64).to_json()
    # an ordinary record names no beaten kernel: whatever it carries there is dropped
    record = Record.from_json({**generated, "best_generated": {"x": [[["junk"]]]}})
    assert record.best_generated == {} and "best_generated" not in record.to_json()
    # a cuBLAS record's beaten kernel: its config as a record's, its figures numbers, nothing nested
    beaten = {"family": "simt", "config": generated["config"], "config_name": generated["config_name"], "ratio": 0.9,
              "tflops": 1.0, "rel_error": 1e-7, "latency_ratio": 0.95}
    cublas = {**generated, "family": "cublas", "config": {}, "config_name": "cublas", "best_generated": beaten}
    assert Record.from_json(cublas).best_generated == beaten
    for junk, message in (({"tflops": [[1.0]]}, "best_generated.tflops"), ({"note": {"deep": [1]}}, "best_generated.note"),
                          ({"latency_ratio": "fast"}, "best_generated.latency_ratio"),
                          ({"ratio": 1e300}, "best_generated.ratio")):
        with pytest.raises(ValueError, match=message):
            Record.from_json({**cublas, "best_generated": {**beaten, **junk}})


def test_a_document_with_duplicate_keys_is_refused(tmp_path):
    entries = _entries(1)
    key, entry = next(iter(entries.items()))
    text = json.dumps({"format": 1, "device": SLUG, "entries": {key: entry}})
    crafted = text.replace('"ratio": 1.0', '"ratio": 1.0, "ratio": 3.0', 1)
    assert crafted != text
    source = tmp_path / "dup.json"
    source.write_text(crafted)
    with pytest.raises(ValueError, match="duplicate key 'ratio'"):
        TuningCache(tmp_path / "cache", shipped=False).import_bundle(source)
    cache = TuningCache(tmp_path / "own", shipped=False)
    cache.directory.mkdir()
    cache.path(SLUG).write_text(crafted)
    with pytest.warns(CacheWarning, match="duplicate key 'ratio'"):
        assert cache.lookup(Problem.from_key(key), SLUG) is None


def test_the_depth_of_json_read_is_bounded_before_parsing():
    from autogemm.results.strict_json import MAX_DEPTH, loads

    assert loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    text = "[{" * MAX_DEPTH + "\\\""  # brackets (and an escaped quote) inside strings do not count
    assert loads(json.dumps({"a": text, "b": [text]})) == {"a": text, "b": [text]}
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_DEPTH}"):
        loads("[" * 100000 + "]" * 100000)


def test_a_recorded_table_is_read_as_strictly(tmp_path):
    from autogemm.measure.recorded import RecordedTable

    lines = (Path(__file__).parent / "data" / "simt_small_4096.jsonl").read_text().splitlines()[:3]
    crafted = tmp_path / "table.jsonl"
    crafted.write_text("\n".join([lines[0], lines[1].replace('"ok": true', '"ok": true, "ok": false', 1), lines[2]]))
    with pytest.raises(ValueError, match="duplicate key 'ok'"):
        RecordedTable.load(crafted)
    crafted.write_text("\n".join([lines[0], lines[1][:-1] + ', "x": ' + "[" * 200 + "]" * 200 + "}"]))
    with pytest.raises(ValueError, match="nested deeper than"):
        RecordedTable.load(crafted)


# ---- figures no GPU can reach ------------------------------------------------------------------
def _current(record: Record) -> Record:
    """The record with its kernel's true source digest: current, as a forger would make it."""
    return dataclasses.replace(record, source_digest=kernel_digest(record.config_object, record.problem_object))


@pytest.mark.parametrize("forged,message", [
    (dict(ratio=1e300, cublas_ms=1e300), "ratio"),
    (dict(tflops=1e9), "tflops"),
    (dict(cublas_tflops=1e7), "cublas_tflops"),
    (dict(time_ms=1e-9, cublas_ms=1e-9), "time_ms"),  # 4096^3 in a picosecond: beyond any roofline
    (dict(ratio=50.0), "ratio"),  # not cublas_ms / time_ms
])
def test_a_forged_record_beyond_what_a_gpu_can_do_is_not_served(tmp_path, forged, message):
    problem = Problem(4096, 4096, 4096)
    honest = _current(dataclasses.replace(make_record(64), problem=problem.key))
    cache = TuningCache(tmp_path, shipped=False)
    cache.store(honest, SLUG)
    assert cache.lookup(problem, SLUG) is not None
    document = json.loads(cache.path(SLUG).read_text())
    document["entries"][problem.key].update(forged)
    cache.path(SLUG).write_text(json.dumps(document))
    with pytest.warns(CacheWarning, match=rf"skipped 1 bad record.*{message}"):
        assert cache.lookup(problem, SLUG) is None
    with pytest.raises(ValueError, match=rf"bad record.*{message}"):
        TuningCache(tmp_path / "other", shipped=False).import_bundle(cache.path(SLUG))


# ---- the command line ----------------------------------------------------------------------------
def test_each_cache_action_has_its_own_help_and_flags(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["cache", "import", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "usage: autogemm cache import" in out
    assert "--output" not in out and "--yes" not in out and "--force" not in out
    for argv in (["cache", "list", "--force"], ["cache", "import", "x.json", "--yes"], ["cache", "clear", "--json"],
                 ["cache", "show", "a", "b"], ["cache", "list", "-o", "x"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
        assert "unrecognized arguments" in capsys.readouterr().err
    # the invocations that worked before still do
    bundle = _bundle(tmp_path / "bundle.json", {SLUG: _entries(2)})
    assert main(["cache", "import", str(bundle)]) == 0
    capsys.readouterr()
    assert main(["cache", "list", "--json"]) == 0 and len(json.loads(capsys.readouterr().out)) >= 2
    assert main(["cache", "merge", str(bundle), "-o", str(tmp_path / "m.json")]) == 0
    assert main(["cache", "export", "-o", str(tmp_path / "e.json")]) == 0
    assert main(["cache", "show", next(iter(_entries(1)))]) == 0
    assert main(["cache", "clear", "--yes"]) == 0
    for argv in (["cache", "retime", "f.json", "--force", "--only", "x"], ["cache", "verify", "--all"]):
        assert main(argv) == 3  # parsed; no GPU here (or no such file)


@pytest.mark.shipped_results
def test_cache_verify_gives_each_kernel_more_than_a_candidates_limit(tmp_path, monkeypatch, capsys):
    """`cache verify --all` on a fresh H100 reported the first shipped kernel it verified hung, after the small
    problem's 10 s candidate limit (the first verification on a fresh machine also compiles CuPy's kernels of
    the check). Each verification now has VERIFY_TIMEOUT_S at least; a failure is still reported."""
    from autogemm.cli import cache as cache_cli
    from autogemm.measure.evaluate import Measurement
    from autogemm.problem import Device

    h100 = dataclasses.replace(Device.for_arch("sm_90"), name="NVIDIA H100 80GB HBM3", sm_count=132)
    cache = TuningCache(tmp_path / "user", shipped=True)
    generated = [r for _, r in cache.records(h100.slug, include_shipped=True) if not r.stale and not r.is_cublas]
    assert generated, "the shipped H100 document serves generated kernels"
    limits = []

    class Evaluator:
        def __init__(self, problem, device, jobs, timeout=None):
            limits.append(timeout)
            self.first = len(limits) == 1

        def verify(self, config):
            if self.first:
                return Measurement.failure("timeout", "no answer within 60.0 s (hung kernel?)")
            return Measurement(ok=True, time_ms=1.0, tflops=1.0, rel_error=0.0)

        def close(self):
            pass

    monkeypatch.setattr(cache_cli, "require_gpu", lambda: None)
    monkeypatch.setattr(cache_cli.launch, "current_device", lambda: h100)
    monkeypatch.setattr(cache_cli, "IsolatedEvaluator", Evaluator)
    assert cache_cli._cache_verify(cache, include_shipped=True) == 1  # (the failure of the first is reported)
    assert len(limits) == len(generated) and cache_cli.VERIFY_TIMEOUT_S == 60.0
    assert all(limit is not None and limit >= 60.0 for limit in limits), limits  # (before: None, the candidate's)
    out = capsys.readouterr().out
    assert f"FAILED  {generated[0].problem}" in out and "(shipped, kept)" in out
