"""Crafted inputs on the newer surfaces (issue 64), each refused or handled without harm: a number too
large for a float anywhere in a cache document, file storages named in a campaign file, FP8 operands
with strides the kernels do not read, a journal cut by a full disk, a re-timing racing a tune, a
planted symlink at a failed source's path, unbounded search-space expressions, FP8 quantization of
inf, NaN and ties, temporary files not written by autogemm, non-canonical problem keys, and JSON
output that strict parsers read and pipes that close early."""

from __future__ import annotations

import json
import warnings

import pytest

from autogemm.cli import main
from autogemm.problem import Problem
from autogemm.results.cache import CacheWarning, TuningCache, read_records
from autogemm.results.merge import merge_files

from test_cache import SLUG, make_record

HUGE = 10 ** 400  # an int JSON carries whole, beyond any float (math.isfinite raises OverflowError)


# ---- 1. a number too large for a float -----------------------------------------------------------
def _document_with(entry_changes: dict | None = None, key: str | None = None) -> tuple[str, str]:
    """(the text of a device document of two records, the bad record's key): the first record's
    fields changed by `entry_changes`, or filed under `key` (and naming it)."""
    good, bad = make_record(64).to_json(), make_record(65).to_json()
    if entry_changes:
        for path, value in entry_changes.items():
            target = bad
            *parents, last = path.split(".")
            for parent in parents:
                target = target.setdefault(parent, {})
            target[last] = value
    bad_key = key or bad["problem"]
    bad["problem"] = bad_key
    return json.dumps({"format": 1, "device": SLUG, "entries": {good["problem"]: good, bad_key: bad}}), bad_key


CUBLAS_BEATEN = {"family": "cublas", "config": {}, "config_name": "cublas",
                 "best_generated": {**{k: v for k, v in make_record(65).to_json().items()
                                       if k in ("family", "config", "config_name")}, "ratio": HUGE}}


@pytest.mark.parametrize("changes, key", [
    ({"time_ms": HUGE}, None), ({"ratio": HUGE}, None), ({"wall_s": HUGE}, None), ({"rel_error": HUGE}, None),
    ({"latency_us": HUGE}, None), ({"baselines": {"cublaslt": HUGE}}, None), (CUBLAS_BEATEN, None),
    (None, "float32/fp32/nn/b1/" + "9" * 311 + "x64x64"),
], ids=["time_ms", "ratio", "wall_s", "rel_error", "latency_us", "baselines", "best_generated.ratio", "huge M"])
def test_a_number_too_large_for_a_float_is_a_bad_record_everywhere(changes, key, tmp_path, monkeypatch, capsys):
    text, bad_key = _document_with(changes, key)
    source = tmp_path / "crafted.json"
    source.write_text(text)
    # read from a file given to import or merge: refused, naming the record, nothing imported
    with pytest.raises(ValueError, match="bad record"):
        read_records(source)
    with pytest.raises(ValueError, match="bad record"):
        merge_files([source], tmp_path / "merged.json")
    # the same document as a cache's own: the record skipped with a warning, the good one served
    cache = TuningCache(tmp_path / "own", shipped=False)
    cache.directory.mkdir()
    cache.path(SLUG).write_text(text)
    with pytest.warns(CacheWarning, match="skipped 1 bad record"):
        records = cache.records(SLUG)
    assert [record.problem for _, record in records] == [make_record(64).problem]
    assert cache.lookup(Problem(64, 64, 64), SLUG) is not None
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "home"))
    tuned = tmp_path / "home" / "tuned"
    tuned.mkdir(parents=True)
    for argv in (["cache", "list"], ["cache", "list", "--json"], ["cache", "export", str(tmp_path / "x.json")],
                 ["cache", "import", str(source)], ["cache", "merge", str(source), "-o", str(tmp_path / "m.json")]):
        (tuned / f"{SLUG}.json").write_text(text)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = main(argv)
        assert code in (0, 2), (argv, code)
    assert "OverflowError" not in capsys.readouterr().err


def test_matmul_chooses_with_a_huge_number_in_the_users_cache(tmp_path):
    """Dispatcher.select reads every record of the device: one bad number must not stop it choosing."""
    from autogemm.serving.planning import Dispatcher
    from autogemm.problem import Device

    text, _ = _document_with({"time_ms": HUGE})
    cache = TuningCache(tmp_path, shipped=False)
    cache.directory.mkdir(exist_ok=True)
    device = Device.for_arch("sm_90")
    cache.path(device.slug).write_text(text.replace(SLUG, device.slug))
    dispatcher = Dispatcher(cache)
    with pytest.warns(CacheWarning, match="skipped 1 bad record"):
        choice = dispatcher.select(Problem(300, 200, 100), device, tune=False)
    assert choice is not None
