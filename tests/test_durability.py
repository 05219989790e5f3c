"""Killing a tune (SIGKILL) at any moment leaves a cache that loads without repair and a study
that loads and resumes; a second tune of the same study at the same time is refused."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
import pytest

from autogemm.cache import CacheWarning, TuningCache
from autogemm.recorded import RecordedEvaluator, RecordedTable
from autogemm.tuner import TuneError, tune

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


def test_twenty_kills_leave_a_loadable_cache_and_study(tmp_path):
    rng = random.Random(20261122)
    trials_seen = []
    for kill in range(20):
        child = _start_child(tmp_path, seed=kill)
        assert child.stdout.readline().strip() == b"started"  # imports done: kill inside the tune
        time.sleep(rng.uniform(0.0, 1.5))
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        trials_seen.append(_assert_loadable(tmp_path))
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
