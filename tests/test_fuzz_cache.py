"""Crafted cache files, as a careless tool or an attacker would write them: 600 documents and bundles
built from a valid one by random mutations (values of other types, out of range, deeply nested,
unknown keys, missing fields, path-like device names). Whatever they hold: nothing is written
outside the cache directory; `autogemm cache list/show/import/verify` and `matmul`'s selection never
raise; what is served is usable; every record passed over is reported by a warning."""

from __future__ import annotations

import copy
import json
import random
import warnings
from pathlib import Path

import pytest

from autogemm.results.cache import CacheWarning, Record, TuningCache
from autogemm.cli import main
from autogemm.serving.planning import Dispatcher
from autogemm.families import SimtConfig, TensorCoreConfig
from autogemm.problem import Device, Problem
from autogemm.kernels.render import kernel_template_hash

# the warnings this test expects it checks itself, where it reads; the rest (the commands') are noise here
pytestmark = pytest.mark.filterwarnings("ignore::autogemm.results.cache.CacheWarning")

DEVICE = Device(name="Fuzz GPU", compute_capability=(9, 0), sm_count=132, smem_per_block_optin=227 * 1024,
                smem_per_sm=228 * 1024)
SLUG = DEVICE.slug
DOCUMENTS = 600


def _record(problem: Problem, config) -> dict:
    return Record(problem=problem.key, family=config.family,
                  config={k: v for k, v in config.to_dict().items() if k != "family"}, config_name=config.name,
                  time_ms=1.0, tflops=1.0, cublas_ms=1.0, cublas_tflops=1.0, ratio=1.0, rel_error=1e-7,
                  template_hash=kernel_template_hash(config.template), device=DEVICE.name,
                  date="2026-11-23T00:00:00+00:00").to_json()


def _valid_document() -> dict:
    entries = {}
    for m, config, dtype in ((64, SimtConfig(), "float32"), (128, SimtConfig(stages=3), "float32"),
                             (256, TensorCoreConfig(instruction="mma"), "float16")):
        problem = Problem(m, m, m, dtype=dtype)
        entries[problem.key] = _record(problem, config)
    return {"format": 1, "device": SLUG, "entries": entries}


JUNK_KEYS = ("", "None", "[]", "../escape", "/tmp/abs", "not a key", "float32/fp32/nn/b1/1x1x1", "a" * 5000,
             "float32/fp32/nn/b1/64x64x64")


def _junk(rng: random.Random, depth: int = 0):
    kind = rng.randrange(12)
    if kind == 0:
        return rng.choice([0, -1, 1, 2**31, 2**32, 2**63, -2**40])
    if kind == 1:
        return rng.choice([0.5, -1.5, 1e308, float("inf"), float("nan")])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return rng.choice(["", "fast", "../../etc/passwd", "/tmp/x", "128", "a" * 5000, "float32/fp32/nn/b1/1x1x1"])
    if kind == 4 and depth < 3:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(3))]
    if kind == 5 and depth < 3:
        return {rng.choice(JUNK_KEYS): _junk(rng, depth + 1) for _ in range(rng.randrange(3))}
    if kind == 6:
        nested = []
        for _ in range(rng.choice([10, 500, 5000])):
            nested = [nested]
        return nested
    return rng.choice([1, 2, 4, 8, 16, 64, 128, 255, 256, "pad", "mma", "wgmma"])


def _mutate(rng: random.Random, document: dict) -> dict:
    doc = copy.deepcopy(document)
    for _ in range(rng.randrange(1, 4)):
        where = rng.randrange(8)
        entries = doc.get("entries") if isinstance(doc.get("entries"), dict) else None
        if where == 0:
            doc[rng.choice(["entries", "format", "device"])] = _junk(rng)
        elif entries and where <= 2:
            key = rng.choice(list(entries))
            entries[key] = _junk(rng) if rng.random() < 0.2 else entries[key]
            if isinstance(entries[key], dict):
                entries[key][rng.choice(list(entries[key]) + ["colour"])] = _junk(rng)
        elif entries and where <= 5:
            entry = entries[rng.choice(list(entries))]
            if isinstance(entry, dict) and isinstance(entry.get("config"), dict):
                config = entry["config"]
                config[rng.choice(list(config) + ["colour", "family"])] = _junk(rng)
        elif entries and where == 6:
            entry = entries[rng.choice(list(entries))]
            if isinstance(entry, dict):
                entry.pop(rng.choice(list(entry)), None)
        elif entries:
            try:
                entries[rng.choice(JUNK_KEYS)] = copy.deepcopy(rng.choice(list(entries.values())))
            except RecursionError:  # an entry nested too deep for copy itself: leave it as it is
                pass
    return doc


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def parser():
    """The command line's parser, built once: building it (argparse, ~20 ms) took three quarters of
    this test's time at four commands per document."""
    import autogemm.cli

    return autogemm.cli.build_parser()


@pytest.mark.parametrize("seed", range(3))
def test_crafted_documents_and_bundles(tmp_path, monkeypatch, capsys, seed, parser):
    import autogemm.cli

    monkeypatch.setattr(autogemm.cli, "build_parser", lambda: parser)  # `main` parses as ever, with the same parser
    rng = random.Random(seed)
    cache_dir = tmp_path / "cache"
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(cache_dir))
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    outside_before = _tree(tmp_path)
    good = _valid_document()
    served = warned = 0
    for index in range(DOCUMENTS // 3):
        document = _mutate(rng, good)
        cache = TuningCache(cache_dir / "tuned", shipped=False)
        cache.directory.mkdir(parents=True, exist_ok=True)
        try:
            text = json.dumps(document)
        except (ValueError, RecursionError):
            continue  # not JSON at all (nan is written, unlike an endless nesting): nothing to read
        cache.path(SLUG).write_text(text)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            records = cache.records(SLUG, include_shipped=False)
            for _, record in records:  # what is served is usable
                assert record.is_cublas or record.config_object.check(record.problem_object, DEVICE) is not None
                assert isinstance(record.date, str) and record.ratio > 0
            for m in (64, 100, 256):
                choice = Dispatcher(cache).select(Problem(m, m, m), DEVICE, tune=False)
                assert choice.source in ("cache", "shipped cache", "predicted", "cublas")
        entries = document.get("entries")
        well_formed = isinstance(entries, dict) and type(document.get("format")) is int and document["format"] == 1
        if not well_formed or len(records) < len(entries):
            assert any(issubclass(w.category, CacheWarning) for w in caught), \
                f"document {index}: {len(records)} records served, no warning: {text[:300]}"
            warned += 1
        served += len(records)
        # the command line on the same files, and the document as a bundle under a crafted name
        assert main(["cache", "list"]) == 0
        assert main(["cache", "show", "float32/fp32/nn/b1/64x64x64"]) in (0, 3)  # 3: nothing cached for it
        name = rng.choice([SLUG, "../../escape", str(tmp_path / "abs"), "x/y", SLUG.upper()])
        bundle = bundles / f"{index}.json"
        bundle.write_text(json.dumps({"format": 1, "devices": {name: document}}))
        assert main(["cache", "import", str(bundle)]) in (0, 2)
        assert main(["cache", "verify"]) in (0, 1, 3)  # without a GPU: says one is needed (3)
        cache.path(SLUG).unlink(missing_ok=True)
    capsys.readouterr()
    # nothing anywhere but in the cache directory and the bundles this test wrote
    new = {p for p in _tree(tmp_path) - outside_before if not p.startswith(("cache", "bundles"))}
    assert not new, new
    assert served > 0 and warned > DOCUMENTS // 12  # both kinds happened
