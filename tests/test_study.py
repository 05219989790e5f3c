"""The study storage: processes that start tuning at once on a fresh cache directory all get their
studies (Optuna creates its tables on first use, which raced), and a default storage file that is
not a database is moved aside and started afresh, not a traceback at every tune."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autogemm.results.cache import TuningCache
from autogemm.measure.recorded import RecordedEvaluator, RecordedTable
from autogemm.tuning.tuner import TuneError, tune

HERE = Path(__file__).parent
TABLE = RecordedTable.load(HERE / "data" / "simt_small_4096.jsonl")


def test_four_processes_tuning_at_once_on_a_fresh_cache_all_succeed(tmp_path):
    # Before the storage was locked, the race hit 2-3 of 6 processes in 2 runs of 3; the processes
    # now wait for each other after their imports (tests/study_child.py) and open the storage at the
    # same moment: without the lock, all but one of them fail in every run.
    cache_dir, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    env = dict(os.environ, AUTOGEMM_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    children = [subprocess.Popen([sys.executable, str(HERE / "study_child.py"), str(i), str(barrier), "5"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    try:
        deadline = time.monotonic() + 300
        while len(list(barrier.glob("ready-*"))) < 4:
            assert time.monotonic() < deadline and all(child.poll() is None for child in children), \
                [child.communicate()[1][-2000:] for child in children if child.poll() is not None]
            time.sleep(0.01)
        (barrier / "go").touch()
        outputs = [child.communicate(timeout=300)[0].strip() for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert outputs == ["OK 5"] * 4, outputs
    storage = f"sqlite:///{cache_dir / 'studies.db'}"
    assert len(optuna.get_all_study_summaries(storage)) == 4


def _tune(cache_dir: Path, storage=None):
    return tune(TABLE.problem, trials=5, timeout=None, space=HERE / "data" / "simt_small.toml", storage=storage,
                study_name="corrupt", evaluator=RecordedEvaluator(TABLE),
                cache=TuningCache(cache_dir / "tuned", shipped=False))


@pytest.mark.parametrize("damage", ["garbage", "zeroed header", "truncated"])
def test_a_default_storage_that_is_not_a_database_is_moved_aside(tmp_path, monkeypatch, caplog, damage):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path))
    assert _tune(tmp_path).valid == 5
    db = tmp_path / "studies.db"
    data = db.read_bytes()
    db.write_bytes({"garbage": b"not a database \x00\x01" * 100, "zeroed header": bytes(100) + data[100:],
                    "truncated": data[: len(data) // 3]}[damage])
    damaged = db.read_bytes()
    result = _tune(tmp_path)
    assert result.valid == 5 and result.study_trials == 5  # started afresh
    # a warning of the library's logger (autogemm.tuning.study), which the command line prints
    assert any(r.levelname == "WARNING" and r.name == "autogemm.tuning.study" and "is not a database; moved it to"
               in r.getMessage() for r in caplog.records)
    (aside,) = tmp_path.glob("studies.db.corrupt-*")
    assert aside.read_bytes() == damaged  # nothing lost: the file is kept for inspection


def test_a_storage_the_user_named_is_never_moved(tmp_path):
    db = tmp_path / "mine.db"
    db.write_bytes(b"not a database \x00\x01" * 100)
    with pytest.raises(TuneError, match=f"the study storage sqlite:///{db} cannot be used"):
        _tune(tmp_path, storage=f"sqlite:///{db}")
    assert db.read_bytes() == b"not a database \x00\x01" * 100


def test_a_journal_storage_is_made_once_per_file_and_process(tmp_path):
    """A new JournalStorage reads the whole log again; a campaign opens a study per problem and space."""
    from autogemm.tuning.study import storage_object

    url = f"journal:///{tmp_path / 'studies.log'}"
    first = storage_object(url)
    assert storage_object(url) is first
    assert storage_object(f"journal:///{tmp_path / 'other.log'}") is not first
    optuna.create_study(study_name="kept", storage=first)
    (tmp_path / "studies.log").unlink()  # a log removed meanwhile: a fresh storage, not the old one's studies
    fresh = storage_object(url)
    assert fresh is not first and not optuna.get_all_study_summaries(storage=fresh)
