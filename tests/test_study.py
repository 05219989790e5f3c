"""The study storage: processes that start tuning at once on a fresh cache directory all get their
studies (Optuna creates its tables on first use, which raced), and a default storage file that is
not a database is moved aside and started afresh, not a traceback at every tune."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autogemm.cache import TuningCache
from autogemm.recorded import RecordedEvaluator, RecordedTable
from autogemm.tuner import TuneError, tune

HERE = Path(__file__).parent
TABLE = RecordedTable.load(HERE / "data" / "simt_small_4096.jsonl")


def test_six_processes_tuning_at_once_on_a_fresh_cache_all_succeed(tmp_path):
    for attempt in range(3):  # the race hit 2-3 of 6 processes in 2 runs of 3 before the storage was locked
        cache_dir = tmp_path / f"cache{attempt}"
        env = dict(os.environ, AUTOGEMM_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
        children = [subprocess.Popen([sys.executable, str(HERE / "study_child.py"), str(i)], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(6)]
        outputs = [child.communicate(timeout=300)[0].strip() for child in children]
        assert all(out == "OK 20" for out in outputs), outputs
        storage = f"sqlite:///{cache_dir / 'studies.db'}"
        assert len(optuna.get_all_study_summaries(storage)) == 6


def _tune(cache_dir: Path, storage=None):
    return tune(TABLE.problem, trials=5, timeout=None, space=HERE / "data" / "simt_small.toml", storage=storage,
                study_name="corrupt", evaluator=RecordedEvaluator(TABLE),
                cache=TuningCache(cache_dir / "tuned", shipped=False))


@pytest.mark.parametrize("damage", ["garbage", "zeroed header", "truncated"])
def test_a_default_storage_that_is_not_a_database_is_moved_aside(tmp_path, monkeypatch, capsys, damage):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path))
    assert _tune(tmp_path).valid == 5
    db = tmp_path / "studies.db"
    data = db.read_bytes()
    db.write_bytes({"garbage": b"not a database \x00\x01" * 100, "zeroed header": bytes(100) + data[100:],
                    "truncated": data[: len(data) // 3]}[damage])
    damaged = db.read_bytes()
    result = _tune(tmp_path)
    assert result.valid == 5 and result.study_trials == 5  # started afresh
    assert "is not a database; moved it to" in capsys.readouterr().err
    (aside,) = tmp_path.glob("studies.db.corrupt-*")
    assert aside.read_bytes() == damaged  # nothing lost: the file is kept for inspection


def test_a_storage_the_user_named_is_never_moved(tmp_path):
    db = tmp_path / "mine.db"
    db.write_bytes(b"not a database \x00\x01" * 100)
    with pytest.raises(TuneError, match=f"the study storage sqlite:///{db} cannot be used"):
        _tune(tmp_path, storage=f"sqlite:///{db}")
    assert db.read_bytes() == b"not a database \x00\x01" * 100
