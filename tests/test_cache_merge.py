"""Caches from several hosts merged into one (`autogemm cache merge`), and records that stay valid
while their own kernel's source does (editing another template leaves them current)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from autogemm.results.cache import TuningCache
from autogemm.results.merge import merge_files
from autogemm.families import SimtConfig
from autogemm.paths import templates_dir
from autogemm.problem import Problem
from autogemm.kernels.render import kernel_digest, kernel_template_hash

from test_cache import SLUG, make_record


def _document(tmp_path, name: str, records, slug: str = SLUG):
    path = tmp_path / name
    path.write_text(json.dumps({"format": 1, "device": slug, "entries": {r.problem: r.to_json() for r in records}}))
    return path


def test_merge_keeps_the_best_record_of_each_problem_with_its_provenance(tmp_path):
    a = [dataclasses.replace(make_record(64, ratio=1.10), host="host-a", versions={"autogemm": "0.9", "driver_api": "13.0"}),
         dataclasses.replace(make_record(128, ratio=1.00), host="host-a")]
    b = [dataclasses.replace(make_record(64, ratio=1.05), host="host-b"),
         dataclasses.replace(make_record(128, ratio=1.20), host="host-b", date="2026-11-24T10:00:00+00:00"),
         dataclasses.replace(make_record(256, ratio=0.90, stale=True), host="host-b")]
    c = [dataclasses.replace(make_record(256, ratio=0.80), host="host-c")]  # current beats a stale one
    other = [dataclasses.replace(make_record(64, ratio=1.3), host="host-d")]
    out = tmp_path / "merged.json"
    assert merge_files([_document(tmp_path, "a.json", a), _document(tmp_path, "b.json", b),
                        _document(tmp_path, "c.json", c)], out) == {SLUG: 3}
    merged = json.loads(out.read_text())
    assert merged["device"] == SLUG  # one device: a document that can serve as cache/<device>.json
    hosts = {key: (entry["host"], entry["ratio"]) for key, entry in merged["entries"].items()}
    assert hosts == {make_record(64).problem: ("host-a", 1.10), make_record(128).problem: ("host-b", 1.20),
                     make_record(256).problem: ("host-c", 0.80)}
    assert merged["entries"][make_record(64).problem]["versions"] == {"autogemm": "0.9", "driver_api": "13.0"}
    assert merged["entries"][make_record(128).problem]["date"] == "2026-11-24T10:00:00+00:00"
    # the merged document serves as a cache directory's document
    target = tmp_path / "cache"
    target.mkdir()
    shutil.copy(out, target / f"{SLUG}.json")
    assert TuningCache(target, shipped=False).lookup(Problem(128, 64, 64), SLUG)[0].host == "host-b"
    # several devices: an export bundle, which import takes
    both = tmp_path / "both.json"
    assert merge_files([_document(tmp_path, "a.json", a), _document(tmp_path, "d.json", other, "other-gpu-sm90")],
                       both) == {SLUG: 2, "other-gpu-sm90": 1}
    assert TuningCache(tmp_path / "imported", shipped=False).import_bundle(both) == 3


def test_a_replacing_merge_keeps_the_later_files_record_whatever_its_ratio(tmp_path):
    """A document re-tuned in part on new code (`cache merge OLD RETUNED --replace -o OLD`): each problem of the
    re-tune takes its new record, a worse ratio too (the better of two draws would select on noise); the others
    stay; the output may be the first input."""
    old = _document(tmp_path, "old.json", [dataclasses.replace(make_record(64, ratio=1.10), host="old"),
                                           dataclasses.replace(make_record(128, ratio=1.02), host="old")])
    retuned = _document(tmp_path, "retuned.json", [dataclasses.replace(make_record(64, ratio=1.00), host="new"),
                                                   dataclasses.replace(make_record(256, ratio=1.05), host="new")])
    from autogemm.cli import main

    assert main(["cache", "merge", str(old), str(retuned), "--replace", "-o", str(old)]) == 0
    hosts = {key: (entry["host"], entry["ratio"]) for key, entry in json.loads(old.read_text())["entries"].items()}
    assert hosts == {make_record(64).problem: ("new", 1.00), make_record(128).problem: ("old", 1.02),
                     make_record(256).problem: ("new", 1.05)}
    # without --replace the better ratio stays
    best = tmp_path / "best.json"
    assert merge_files([_document(tmp_path, "a.json", [make_record(64, ratio=1.10)]), retuned], best) == {SLUG: 2}
    assert json.loads(best.read_text())["entries"][make_record(64).problem]["ratio"] == 1.10


def test_merge_refuses_a_bad_record_and_writes_nothing(tmp_path):
    good = _document(tmp_path, "good.json", [make_record(64)])
    entry = make_record(96).to_json()
    entry["ratio"] = -1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 1, "device": SLUG, "entries": {entry["problem"]: entry}}))
    out = tmp_path / "out.json"
    with pytest.raises(ValueError, match=r"bad.json: bad record .*ratio must be a positive number"):
        merge_files([good, bad], out)
    assert not out.exists()
    evil = tmp_path / "evil.json"
    evil.write_text(json.dumps({"format": 1, "device": "../../etc", "entries": {}}))
    with pytest.raises(ValueError, match="not a device name"):
        merge_files([evil], out)
    assert not out.exists()


def test_cache_merge_from_the_command_line(tmp_path, capsys):
    from autogemm.cli import main

    a = _document(tmp_path, "a.json", [dataclasses.replace(make_record(64, ratio=1.1), host="host-a")])
    b = _document(tmp_path, "b.json", [dataclasses.replace(make_record(64, ratio=1.2), host="host-b")])
    out = tmp_path / "out.json"
    assert main(["cache", "merge", str(a), str(b), "-o", str(out)]) == 0
    assert "1 records of" in capsys.readouterr().out
    assert json.loads(out.read_text())["entries"][make_record(64).problem]["host"] == "host-b"
    with pytest.raises(SystemExit) as info:  # -o is required: argparse says so
        main(["cache", "merge", str(a)])
    assert info.value.code == 2 and "the following arguments are required: -o/--output" in capsys.readouterr().err
    assert main(["cache", "merge", str(tmp_path / "missing.json"), "-o", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err


def _with_digest(record):
    config, problem = record.config_object, record.problem_object
    return dataclasses.replace(record, source_digest=kernel_digest(config, problem), template_hash="0" * 16)


def test_a_record_stays_current_while_its_own_kernel_source_is_the_same(tmp_path, monkeypatch):
    before_digests = make_record(64)  # a record written before source digests: template hash only
    record = _with_digest(make_record(64))
    assert not record.stale  # its template hash is wrong on purpose: the source digest decides
    override = tmp_path / "templates"
    override.mkdir()
    monkeypatch.setenv("AUTOGEMM_TEMPLATE_DIR", str(override))
    # another family's template edited: this record is untouched
    hopper = (templates_dir() / "hopper_gemm.cu.j2").read_text()
    (override / "hopper_gemm.cu.j2").write_text(hopper.replace("constexpr int WARPGROUP = 128;",
                                                               "constexpr int WARPGROUP = 128;  // edited"))
    assert not record.stale
    # its own template edited where it renders nothing (a Jinja comment): still current, though
    # the template's hash changed
    template = SimtConfig().template
    own = (templates_dir() / template).read_text()
    (override / template).write_text("{# an edit that renders nothing #}\n" + own)
    assert kernel_template_hash(template) != before_digests.template_hash
    assert not record.stale
    # an edit that changes its source: stale
    (override / template).write_text("// an edit that renders\n" + own)
    assert record.stale
    # a record written before source digests existed falls back to the template hash
    assert before_digests.stale
