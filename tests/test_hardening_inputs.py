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
    for argv in (["cache", "list"], ["cache", "list", "--json"], ["cache", "export", "-o", str(tmp_path / "x.json")],
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


# ---- 2. a campaign file's storage ------------------------------------------------------------------
def _campaign_file(folder, storage: str, name: str = "c.toml"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f'[campaign]\nname = "c"\nstorage = {json.dumps(storage)}\n[[problems]]\nM = 64\n')
    return path


@pytest.mark.parametrize("scheme", ["journal:///", "sqlite:///"])
def test_a_file_storage_named_in_a_campaign_file_stays_in_its_folder(scheme, tmp_path, capsys):
    from autogemm.campaigns.file import CampaignFileError, load_campaign

    folder = tmp_path / "campaigns"
    inside = load_campaign(_campaign_file(folder, f"{scheme}studies/s.log"))
    assert inside.storage == f"{scheme}{(folder / 'studies' / 's.log').resolve()}"  # beside the file, wherever run
    assert load_campaign(_campaign_file(folder, f"{scheme}{folder / 'abs.db'}")).storage == f"{scheme}{folder / 'abs.db'}"
    outside = tmp_path / "elsewhere" / "studies.log"
    for given in (f"{scheme}{outside}", f"{scheme}../elsewhere/s.log", f"{scheme}~/s.log"):
        with pytest.raises(CampaignFileError, match="campaign.storage"):
            load_campaign(_campaign_file(folder, given))
    (folder / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(CampaignFileError, match="campaign.storage"):
        load_campaign(_campaign_file(folder, f"{scheme}link/s.log"))
    trusted = _campaign_file(folder, f"{scheme}{outside}", name="trusted.toml")
    assert load_campaign(trusted, trust_cache_dir=True).storage == f"{scheme}{outside}"
    code = main(["campaign", "status", str(trusted)])
    err = capsys.readouterr().err
    assert code == 2 and "campaign.storage" in err and "--trust-paths" in err
    assert not outside.parent.exists() and not (tmp_path / "elsewhere.claims.db").exists()  # nothing made
    # a database server is not a file: taken as it is
    server = load_campaign(_campaign_file(folder, "postgresql+psycopg2://tuner@db.example/autogemm", name="pg.toml"))
    assert server.storage == "postgresql+psycopg2://tuner@db.example/autogemm"


# ---- 4. a journal cut by a full disk ---------------------------------------------------------------
def _journal_with_a_study(path):
    import optuna

    from autogemm.tuning.study import storage_object

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=storage_object(f"journal:///{path}"), load_if_exists=True)
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=3)
    return study


def _fresh_journals(monkeypatch):
    from autogemm.tuning import journal

    monkeypatch.setattr(journal, "_JOURNALS", {})  # each open below as a new process opens it


def test_a_journal_never_gets_a_line_joined_to_a_partial_one(tmp_path, monkeypatch):
    import optuna

    from autogemm.tuning.study import storage_object

    path = tmp_path / "studies.log"
    _journal_with_a_study(path)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"op_code": 4, "worker_id": "w", "trial_id": 1, "par')  # a write cut short
    _fresh_journals(monkeypatch)
    study = optuna.load_study(study_name="s", storage=storage_object(f"journal:///{path}"))
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)  # appends after the cut line
    _fresh_journals(monkeypatch)
    again = optuna.load_study(study_name="s", storage=storage_object(f"journal:///{path}"))
    assert len(again.trials) == 5 and path.read_bytes().startswith(whole)
    assert all(line for line in path.read_bytes().split(b"\n")[:-1])


def test_a_partial_line_left_by_another_writer_is_cut_before_the_next_append(tmp_path, monkeypatch):
    import optuna

    from autogemm.tuning.study import storage_object

    path = tmp_path / "studies.log"
    study = _journal_with_a_study(path)  # this process's storage stays open, as a long worker's does
    with open(path, "ab") as file:
        file.write(b'{"op_code": 4, "work')  # another process's write, cut short
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    _fresh_journals(monkeypatch)
    assert len(optuna.load_study(study_name="s", storage=storage_object(f"journal:///{path}")).trials) == 4


def test_an_append_that_fails_takes_back_what_it_wrote(tmp_path, monkeypatch):
    import optuna

    from autogemm.tuning.study import storage_object

    path = tmp_path / "studies.log"
    study = _journal_with_a_study(path)
    whole = path.read_bytes()
    real_fsync = __import__("os").fsync

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    monkeypatch.setattr("os.fsync", real_fsync)
    assert path.read_bytes() == whole
    _fresh_journals(monkeypatch)
    assert len(optuna.load_study(study_name="s", storage=storage_object(f"journal:///{path}")).trials) == 3


def test_a_journal_already_broken_is_moved_aside_and_its_prefix_kept(tmp_path, monkeypatch):
    import optuna

    from autogemm.tuning.journal import JournalWarning
    from autogemm.tuning.study import storage_object

    path = tmp_path / "studies.log"
    _journal_with_a_study(path)
    lines = path.read_bytes().split(b"\n")
    broken = b"\n".join(lines[:4] + [lines[4][:10] + lines[5]] + lines[6:])  # a cut line joined by the next
    path.write_bytes(broken)
    _fresh_journals(monkeypatch)
    with pytest.warns(JournalWarning, match="broken at line 5"):
        storage = storage_object(f"journal:///{path}")
    assert path.read_bytes() == b"".join(line + b"\n" for line in lines[:4])
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("studies.log.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == broken
    optuna.create_study(study_name="s", storage=storage, load_if_exists=True).optimize(
        lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)


def test_a_file_that_is_not_a_journal_is_never_appended_to(tmp_path, monkeypatch):
    from autogemm.tuning.study import StudyStorageError, storage_object

    path = tmp_path / "notes.txt"
    path.write_text("my own notes\nsecond line\n")
    _fresh_journals(monkeypatch)
    with pytest.raises(StudyStorageError, match="not an Optuna journal"):
        storage_object(f"journal:///{path}")
    assert path.read_text() == "my own notes\nsecond line\n"


# ---- 3. FP8 operands and bias with strides the kernels do not read -------------------------------
class _FakeArray:
    """What check_call reads of a CuPy array: shape, strides (bytes), dtype, device, C-contiguity."""

    def __init__(self, shape, strides_elements, dtype):
        import numpy as np
        from types import SimpleNamespace

        from autogemm.gpu.operands import contiguous_strides

        self.dtype = np.dtype(dtype)
        self.shape, self.strides = tuple(shape), tuple(s * self.dtype.itemsize for s in strides_elements)
        self.device = SimpleNamespace(id=0)
        contiguous = all(s == expected for s, expected in zip(strides_elements, contiguous_strides(tuple(shape), 1)))
        self.flags = SimpleNamespace(c_contiguous=contiguous)


@pytest.mark.parametrize("a, b, bias, message", [
    (((1, 64), (64, 2)), ((64, 32), (1, 64)), None, "a must be row-major"),     # a 1 × K row read with stride 2
    (((1, 64), (64, -1)), ((64, 32), (1, 64)), None, "a must be row-major"),    # ... reversed
    (((8, 64), (64, 1)), ((64, 1), (2, 64)), None, "b must be column-major"),   # a K × 1 column with stride 2
    (((8, 64), (64, 1)), ((64, 32), (1, 64)), ((32,), (2,)), "bias must be contiguous"),   # bias[::2]
    (((8, 64), (64, 1)), ((64, 32), (1, 64)), ((32,), (-1,)), "bias must be contiguous"),  # bias[::-1]
])
def test_fp8_operands_and_bias_with_strides_the_kernels_do_not_read_are_refused(a, b, bias, message):
    from autogemm.gpu.operands import contiguous_strides
    from autogemm.serving.scaled import check_call

    a_array, b_array = _FakeArray(*a, "uint8"), _FakeArray(*b, "uint8")
    scale = _FakeArray((1,), (1,), "float32")
    bias_array = None if bias is None else _FakeArray(*bias, "float32")
    with pytest.raises(ValueError, match=message):
        check_call(a_array, b_array, scale, scale, bias_array, "float32", dtype="float8_e4m3fn")
    # the same call with unit strides is taken
    a_good = _FakeArray(a[0], contiguous_strides(a[0], 1), "uint8")
    b_good = _FakeArray(b[0], (1, b[0][0]), "uint8")
    bias_good = None if bias is None else _FakeArray(bias[0], (1,), "float32")
    call = check_call(a_good, b_good, scale, scale, bias_good, "float32", dtype="float8_e4m3fn")
    assert (call.m, call.n, call.k) == (a[0][0], b[0][1], 64)


# ---- 5. a re-timing racing a tune --------------------------------------------------------------------
def test_cache_retime_keeps_a_tune_that_finished_while_it_measured(tmp_path, monkeypatch):
    import dataclasses

    from autogemm.measure import retime
    from autogemm.problem import Device

    device = Device.for_arch("sm_90")
    cache = TuningCache(tmp_path, shipped=False)
    first, second = make_record(64), make_record(65)
    for record in (first, second):
        cache.store(record, device.slug)
    tuned = dataclasses.replace(first, ratio=1.5, cublas_ms=1.5, study="a tune that finished meanwhile")

    def measure(record, device, seed=0):
        if record.problem == first.problem:  # while this one is measured, a tune stores its result
            cache.store(tuned, device.slug, keep_better=False)
        return dataclasses.replace(record, ratio=0.5, cublas_ms=0.5, study="re-timed")

    monkeypatch.setattr(retime, "retime_record", measure)
    monkeypatch.setattr(retime, "_precompile", lambda records, device, jobs: None)
    said = []
    done = retime.retime_document(cache.path(device.slug), device, force=True, progress=said.append)
    entries = json.loads(cache.path(device.slug).read_text())["entries"]
    assert entries[first.problem]["study"] == "a tune that finished meanwhile"  # the tune's, not overwritten
    assert entries[second.problem]["study"] == "re-timed"  # the other record re-timed as before
    assert [item.key for item in done] == [second.problem]
    assert any(line.startswith(f"kept    {first.problem}") for line in said), said


# ---- 6. a symlink planted where a failed kernel's source is saved -------------------------------------
def test_a_failed_source_replaces_a_planted_symlink_and_never_follows_it(tmp_path, monkeypatch):
    from autogemm.families import SimtConfig
    from autogemm.kernels.compile import save_failed_source
    from autogemm.kernels.render import render

    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "cache"))
    source = render(SimtConfig(), Problem(64, 64, 64))
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's file\n")
    folder = tmp_path / "cache" / "failed"
    folder.mkdir(parents=True)
    (folder / f"{source.kernel}.cu").symlink_to(victim)
    saved = save_failed_source(source)
    assert saved == folder / f"{source.kernel}.cu" and not saved.is_symlink() and saved.read_text() == source.code
    assert victim.read_text() == "someone's file\n"
    # a folder that is itself a link elsewhere: nothing written there
    (folder / f"{source.kernel}.cu").unlink()
    folder.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder.symlink_to(elsewhere, target_is_directory=True)
    assert save_failed_source(source) is None and list(elsewhere.iterdir()) == []


# ---- 9. temporary files autogemm did not write ------------------------------------------------------
def test_only_autogemms_own_temporary_files_are_removed(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys
    import time

    from autogemm import atomic_write

    target = tmp_path / "bundle.json"
    old = time.time() - 2 * atomic_write.ORPHAN_AGE_S
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    host, namespace = atomic_write._host(), atomic_write._namespace()
    users = tmp_path / ".bundle.json.notes.tmp"  # a user's own file of that shape, old
    other_namespace = tmp_path / f".bundle.json.{host}.{int(namespace) + 1}.{pid}.0123abcd.tmp"  # live elsewhere
    ours_dead = tmp_path / f".bundle.json.{host}.{namespace}.{pid}.0123abcd.tmp"
    ours_old = tmp_path / ".bundle.json.otherhost.99.0123abcd.tmp"  # an earlier version's form, a day old
    for path in (users, other_namespace, ours_dead, ours_old):
        path.write_text("x")
    for path in (users, ours_old):
        os.utime(path, (old, old))
    removed = atomic_write.remove_orphans(target)
    assert sorted(removed) == sorted([ours_dead, ours_old])
    assert users.exists() and other_namespace.exists()
    atomic_write.write_atomically(target, b"{}")
    assert users.exists() and target.read_bytes() == b"{}"


# ---- 7. search-space expressions beyond any space's ----------------------------------------------------
def _space_with(tmp_path, derived: dict[str, str] = (), rule: str | None = None):
    from autogemm.kernels.space import SearchSpace

    shipped = SearchSpace.load().path.read_text()
    lines = "".join(f"{name} = {json.dumps(text)}\n" for name, text in dict(derived).items())
    text = shipped.replace("[derived]\n", "[derived]\n" + lines, 1)
    if rule is not None:
        text = text.replace("rules = [", f"rules = [\n    {json.dumps(rule)},", 1)
    path = tmp_path / "space.toml"
    path.write_text(text)
    return path


def test_a_chain_of_doubling_strings_is_a_space_error_not_gigabytes(tmp_path):
    from autogemm.kernels.space import SearchSpace, SpaceError

    chain = {"s0": "'xxxxxxxx'", **{f"s{i}": f"s{i - 1} + s{i - 1}" for i in range(1, 40)}}
    path = _space_with(tmp_path, chain, rule="s39 != ''")
    with pytest.raises(SpaceError, match="too long"):
        space = SearchSpace.load(path)
        space.sample(1, Problem(256, 256, 256), seed=0)


@pytest.mark.parametrize("rule, message", [
    ("(" * 5000 + "1" + ")" * 5000 + " > 0", "too long|nested"),
    ("(" * 200 + "1" + ")" * 200 + " > 0", "nested more than"),
    ("1" + " + 1" * 1000 + " > 0", "too deep|too long"),
    ("-" * 3000 + "1 < 0", "too deep|too long"),
])
def test_deep_or_long_expressions_are_space_errors(tmp_path, rule, message):
    from autogemm.kernels.space import SearchSpace, SpaceError

    with pytest.raises(SpaceError, match=message):
        SearchSpace.load(_space_with(tmp_path, rule=rule))


# ---- 8. FP8 quantization of inf, NaN and ties ---------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_quantize_saturates_infinities_keeps_nan_and_rounds_ties_to_even(dtype):
    import ml_dtypes
    import numpy as np

    from autogemm import fp8

    largest = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}[dtype]
    values = fp8.to_float64(fp8.quantize(np.array([np.inf, -np.inf, 1e9, -1e9]), dtype), dtype)
    assert values.tolist() == [largest, -largest, largest, -largest]
    assert np.isnan(fp8.to_float64(fp8.quantize(np.array([np.nan]), dtype), dtype)).all()
    # every value and every midpoint between neighbours, against ml_dtypes' own rounding (in range)
    finite, _ = fp8._sorted_finite(dtype)
    midpoints = (finite[:-1] + finite[1:]) / 2
    rng = np.random.default_rng(5)
    x = np.concatenate([finite, midpoints, rng.uniform(-largest, largest, 20000), rng.uniform(-1, 1, 20000)])
    expected = x.astype(getattr(ml_dtypes, dtype)).astype(np.float64)
    got = fp8.to_float64(fp8.quantize(x, dtype), dtype)
    assert np.array_equal(got, expected), x[got != expected][:5]


# ---- 10. non-canonical problem keys -------------------------------------------------------------------
@pytest.mark.parametrize("key", ["float32/fp32/nn/b1/0256x4096x11008", "float32/fp32/nn/b01/256x4096x11008",
                                 "float32/fp32/nn/b1/２５６x4096x11008"])
def test_a_problem_key_must_be_canonical(key, tmp_path):
    with pytest.raises(ValueError, match="problem key"):
        Problem.from_key(key)
    # an import beside the canonical key is refused, naming the key
    canonical = make_record(256).to_json()
    crafted = {**canonical, "problem": key}
    source = tmp_path / "bundle.json"
    source.write_text(json.dumps({"format": 1, "device": SLUG, "entries": {canonical["problem"]: canonical,
                                                                           key: crafted}}))
    with pytest.raises(ValueError, match="bad record"):
        read_records(source)


def test_canonical_keys_read_back_as_themselves():
    for problem in (Problem(256, 4096, 11008), Problem(7, 1, 3, batch=4, dtype="float16", trans_a=True)):
        assert Problem.from_key(problem.key) == problem


# ---- 11. machine-readable output -------------------------------------------------------------------
def test_cache_list_json_is_strict_json_with_null_for_nan(tmp_path, monkeypatch, capsys):
    import dataclasses
    import math

    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path))
    TuningCache(tmp_path / "tuned", shipped=False).store(dataclasses.replace(make_record(64), rel_error=math.nan), SLUG)
    assert main(["cache", "list", "--json"]) == 0
    out = capsys.readouterr().out

    def refuse(constant):
        raise ValueError(f"bare {constant} in the output")

    records = json.loads(out, parse_constant=refuse)  # what a strict parser (jq, JSON.parse) does
    mine = [r for r in records if r["device_slug"] == SLUG]
    assert mine and mine[0]["rel_error"] is None
    assert main(["cache", "show", make_record(64).problem]) == 0
    json.loads(capsys.readouterr().out, parse_constant=refuse)


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, AUTOGEMM_CACHE_DIR=str(tmp_path))
    # the shipped results are hundreds of records: `| head -c 100` closes the pipe long before the end
    done = subprocess.run(f"{sys.executable} -m autogemm.cli cache list --json | head -c 100 > /dev/null; "
                          "echo status=${PIPESTATUS[0]}", shell=True, executable="/bin/bash", env=env,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert "status=141" in done.stdout, done.stdout
