"""Killing a tune (SIGKILL) at any moment leaves a cache that loads without repair and a study
that loads and resumes; a second tune of the same study at the same time is refused."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
import pytest

from autogemm.results.cache import CacheWarning, TuningCache
from autogemm.measure.recorded import RecordedEvaluator, RecordedTable
from autogemm.tuning.tuner import TuneError, tune

HERE = Path(__file__).parent
TABLE = RecordedTable.load(HERE / "data" / "simt_small_4096.jsonl")


def _start_child(workdir: Path, seed: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    return subprocess.Popen([sys.executable, str(HERE / "durability_child.py"), str(workdir), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def _assert_loadable(workdir: Path) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # a corrupt cache file would warn
        document = TuningCache(workdir / "tuned", shipped=False).document(TABLE.device.slug)
    assert isinstance(document["entries"], dict)
    if not (workdir / "studies.db").exists():
        return 0
    try:
        study = optuna.load_study(study_name="durability", storage=f"sqlite:///{workdir / 'studies.db'}")
    except KeyError:  # killed after the file was made but before the study was: a study with no trials
        return 0
    return len(study.get_trials(deepcopy=False))


def _stored_trials(workdir: Path) -> int:
    """The trials in the study storage so far, read without writing anything (0 before its tables)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{workdir / 'studies.db'}?mode=ro", uri=True)) as db:
            return db.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    except sqlite3.Error:
        return 0


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ten_kills_leave_a_loadable_cache_and_study(tmp_path):
    """Every other kill lands at a random moment of the tune's start (storage made, study opened,
    first trials); the others once the tune has stored a trial of its own, at a random moment among
    its trials' and cache records' writes (a kill timed from the start alone reached that part in 2
    of 20 kills). The tunes are forked by one process that has done their imports."""
    rng = random.Random(20261122)
    trials_seen = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]), OPENBLAS_NUM_THREADS="1")
    with open(tmp_path / "children.err", "w") as errors:
        server = subprocess.Popen([sys.executable, str(HERE / "durability_child.py"), "--fork"], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors)
    try:
        for kill in range(10):
            before = _stored_trials(tmp_path)
            server.stdin.write(f"{tmp_path} {kill}\n")
            server.stdin.flush()
            started, pid = server.stdout.readline().split()
            assert started == "started", (tmp_path / "children.err").read_text()[-2000:]
            if kill % 2:
                deadline = time.monotonic() + 120
                while _stored_trials(tmp_path) <= before:
                    assert time.monotonic() < deadline and _running(int(pid)), "the tune stored no trial"
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.5))
            else:
                time.sleep(rng.uniform(0.0, 1.5))
            os.kill(int(pid), signal.SIGKILL)
            exited, status = server.stdout.readline().split()
            assert exited == "exited" and os.WIFSIGNALED(int(status)) and os.WTERMSIG(int(status)) == signal.SIGKILL
            trials_seen.append(_assert_loadable(tmp_path))
    finally:
        server.kill()
        server.wait()
    assert trials_seen[-1] > 0, "no trial ever reached the study"
    assert trials_seen == sorted(trials_seen), "a kill lost trials that were already stored"
    # and the study resumes
    result = tune(TABLE.problem, trials=5, timeout=None, space=HERE / "data" / "simt_small.toml",
                  storage=f"sqlite:///{tmp_path / 'studies.db'}", study_name="durability",
                  evaluator=RecordedEvaluator(TABLE), cache=TuningCache(tmp_path / "tuned", shipped=False))
    assert result.valid == 5
    assert result.study_trials > 5  # the killed runs' measurements are part of the study


def test_second_tune_of_the_same_study_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path))
    child = _start_child(tmp_path, seed=0)
    try:
        assert child.stdout.readline().strip() == b"started"
        time.sleep(1.0)  # holds the study lock by now
        with pytest.raises(TuneError, match="another autogemm tune is already running study durability"):
            tune(TABLE.problem, trials=5, timeout=None, space=HERE / "data" / "simt_small.toml",
                 storage=f"sqlite:///{tmp_path / 'studies.db'}", study_name="durability",
                 evaluator=RecordedEvaluator(TABLE), cache=TuningCache(tmp_path / "tuned", shipped=False))
    finally:
        child.kill()
        child.wait(30)


def test_a_kill_between_the_storage_and_the_study_leaves_no_trials(tmp_path):
    """The state a kill leaves when it lands after studies.db was made but before the study row:
    a study with no trials, not an error."""
    optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")  # tables, no study
    assert _assert_loadable(tmp_path) == 0
