"""Campaigns against crafted inputs: campaign files that are too big or hold values that would
stop every worker, cache directories outside the file's folder, claims of other PID namespaces or
in unknown states, studies another version wrote, storage failures, readers that must not write,
and a fuzz of campaign files (each one refused, naming its key, or read, quickly and in little
memory)."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest

from autogemm.results.cache import TuningCache
from autogemm.campaigns.file import MAX_PROBLEMS, CampaignFileError, load_campaign, parse_campaign
from autogemm.campaigns.claims import ClaimBoard, ClaimState, claims_table, new_owner
from autogemm.cli import main
from autogemm.measure.recorded import RecordedEvaluator, RecordedTable

from campaign_helpers import SPACE_PATH, ReplayFactory
from test_cache import make_record
from test_campaign import postgres_server, postgres_url  # noqa: F401 (fixtures)

HERE = Path(__file__).parent
TABLE = RecordedTable.load(HERE / "data" / "simt_small_4096.jsonl")
SLUG = "nvidia-h200-sm90"  # the recorded table's device
KEY = "float32/fp32/nn/b1/64x64x64"


def run_cli(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# ---- the campaign file: size -----------------------------------------------------------------
_CHILD = """
import sys, time, tracemalloc
from autogemm.campaigns.file import CampaignFileError, load_campaign
tracemalloc.start()
started = time.perf_counter()
try:
    load_campaign(sys.argv[1])
    print("READ")
except CampaignFileError as exc:
    print("REFUSED", exc)
print(time.perf_counter() - started, tracemalloc.get_traced_memory()[1])
"""


_GRID = "[[problems]]\nM = {sizes}\nN = {sizes}\nK = {sizes}\n".format(sizes=list(range(1, 601)))
_TABLES = "".join(f"[[problems]]\nM = {list(range(1 + 100 * i, 101 + 100 * i))}\nN = {list(range(1, 100))}\nK = 8\n"
                  for i in range(40))


@pytest.mark.parametrize("text, fault", [
    (_GRID, "problems[0] makes"),  # a 7 KB grid of 600^3 problems: built whole (15 GB, a minute), then refused
    # 40 tables each under the limit: every one built (850 MB with the old limit) before the total was counted
    (_TABLES, "the campaign makes"),
])
def test_a_campaign_too_big_is_refused_before_it_is_built(tmp_path, text, fault):
    path = tmp_path / "big.toml"
    path.write_text('[campaign]\nname = "big"\n' + text)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    # a child with 2 GB of address space and 20 s: the old parser ran out of both
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
    try:
        child = subprocess.run([sys.executable, "-c", limit + _CHILD, str(path)], capture_output=True, text=True,
                               timeout=20, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the campaign file was still being read after 20 s")
    assert child.returncode == 0, child.stderr[-2000:]
    verdict, figures = child.stdout.strip().splitlines()
    assert verdict.startswith("REFUSED") and fault in verdict and f"at most {MAX_PROBLEMS}" in verdict
    seconds, peak = figures.split()
    # refused from the lists' lengths: well under the old parser's minute and 15 GB (a loaded 2-core machine
    # took 2.1 s with tracemalloc on, so the time bound leaves room; the memory bound is the sharp one)
    assert float(seconds) < 10.0 and int(peak) < 200e6


# ---- the campaign file: values -----------------------------------------------------------------
@pytest.mark.parametrize("head, fault", [
    ({"seed": -1}, "campaign.seed"),
    ({"seed": 2 ** 32}, "campaign.seed"),
    ({"grace": math.inf}, "campaign.grace"),
    ({"grace": math.nan}, "campaign.grace"),
    ({"grace": 1e-300}, "campaign.grace"),
    ({"grace": 0.5}, "campaign.grace"),
    ({"grace": 1e300}, "campaign.grace"),  # (a heartbeat thread cannot wait that long)
    ({"timeout": math.inf}, "campaign.timeout"),
    ({"timeout": 1e300}, "campaign.timeout"),
    ({"trials": 10 ** 30}, "campaign.trials"),
    ({"patience": 10 ** 30}, "campaign.patience"),
    ({"storage": "sqlite:///:memory:"}, "campaign.storage"),
    ({"storage": "sqlite:///"}, "campaign.storage"),
    ({"storage": "journal:///"}, "campaign.storage"),
    ({"storage": "sqlite:///a\nb.db"}, "campaign.storage"),
    ({"devices": list(range(5000))}, "campaign.devices"),
])
def test_values_that_would_stop_every_worker_are_refused_with_the_key_named(head, fault):
    with pytest.raises(CampaignFileError, match=fault.replace(".", r"\.")):
        parse_campaign({"campaign": {"name": "x", **head}, "problems": [{"M": 8}]})


def test_the_largest_seed_and_shortest_grace_allowed_work():
    campaign = parse_campaign({"campaign": {"name": "x", "seed": 2 ** 32 - 1, "grace": 1.0}, "problems": [{"M": 8}]})
    assert (campaign.tune_options.seed, campaign.grace) == (2 ** 32 - 1, 1.0)


def test_a_helper_tune_with_the_largest_seed_searches(tmp_path):
    # a helper's sampler takes another seed than the holder's: added to 2**32 - 1 it left numpy's
    # range and every helper died
    from autogemm.tuning.study import Sharing
    from autogemm.tuning.tuner import tune

    asked = []

    def keep_helping():
        asked.append(1)
        return len(asked) < 2

    result = tune(TABLE.problem, trials=10, timeout=None, seed=2 ** 32 - 1, space=SPACE_PATH,
                  storage=f"sqlite:///{tmp_path / 'studies.db'}", study_name="helped", evaluator=RecordedEvaluator(TABLE),
                  cache=TuningCache(tmp_path / "tuned", shipped=False), sharing=Sharing(keep_helping=keep_helping))
    assert result is None and asked
    assert len(optuna.load_study(study_name="helped", storage=f"sqlite:///{tmp_path / 'studies.db'}").trials) >= 1


# ---- the campaign file: its cache directory ----------------------------------------------------
def _file(folder: Path, cache_dir: str, name: str = "c.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f'[campaign]\nname = "c"\ncache_dir = {json.dumps(cache_dir)}\n[[problems]]\nM = 64\n')
    return path


def test_a_cache_dir_outside_the_campaign_folder_is_refused_unless_trusted(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    folder = tmp_path / "campaigns"
    assert load_campaign(_file(folder, "results")).cache_dir == str((folder / "results").resolve())
    assert load_campaign(_file(folder, str(folder / "abs"))).cache_dir == str(folder / "abs")  # absolute, inside
    for outside in ("../cache", "results/../../elsewhere", "~/somewhere"):
        with pytest.raises(CampaignFileError, match="campaign.cache_dir"):
            load_campaign(_file(folder, outside))
    (folder / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(CampaignFileError, match="campaign.cache_dir"):
        load_campaign(_file(folder, "link/cache"))
    absolute = _file(folder, str(tmp_path / "shared-cache"), name="absolute.toml")
    with pytest.raises(CampaignFileError, match="campaign.cache_dir .*--trust-paths"):
        load_campaign(absolute)
    assert load_campaign(absolute, trust_cache_dir=True).cache_dir == str(tmp_path / "shared-cache")
    with pytest.raises(CampaignFileError, match="campaign.cache_dir"):  # a relative escape: never
        load_campaign(_file(folder, "../cache", name="up.toml"), trust_cache_dir=True)
    code, _, err = run_cli(capsys, "campaign", "status", str(absolute))
    assert code == 2 and "campaign.cache_dir" in err and "--trust-paths" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "campaign", "status", str(absolute), "--trust-cache-dir")
    assert code == 0, err


def test_the_files_storage_is_placed_beside_it_also_where_the_command_line_names_the_cache_dir(tmp_path):
    """--cache-dir replaces the file's cache_dir only: its storage's path is still the file's neighbour
    and still refused outside its folder (not left relative to wherever the command runs)."""
    folder = tmp_path / "campaigns"
    folder.mkdir()
    path = folder / "c.toml"
    for storage in ("sqlite:///board/studies.db", "journal:///board/studies.log"):
        path.write_text(f'[campaign]\nname = "c"\nstorage = "{storage}"\n[[problems]]\nM = 64\n')
        for cache_dir in (None, tmp_path / "mine"):
            campaign = load_campaign(path, cache_dir=cache_dir)
            assert campaign.storage == storage.split("///")[0] + "///" + str(folder.resolve() / storage.split("///")[1])
    path.write_text('[campaign]\nname = "c"\nstorage = "sqlite:///../studies.db"\n[[problems]]\nM = 64\n')
    with pytest.raises(CampaignFileError, match="campaign.storage"):
        load_campaign(path, cache_dir=tmp_path / "mine")


def test_a_file_storage_in_a_folder_not_made_yet_is_made_by_the_board(tmp_path):
    """A campaign file's storage may name a folder beside it that does not exist yet (the module says
    so): SQLite makes no folders, and the worker died on "unable to open database file"."""
    from autogemm.campaigns.claims import ClaimBoard

    for storage in (f"sqlite:///{tmp_path / 'board' / 'studies.db'}", f"journal:///{tmp_path / 'log' / 'studies.log'}"):
        board = ClaimBoard(storage)
        board.register("c", "gpu", ["k"])
        assert [claim.problem for claim in board.claims("c")] == ["k"]
    assert (tmp_path / "board" / "studies.db").is_file() and (tmp_path / "log" / "studies.log.claims.db").is_file()


# ---- the claim board -------------------------------------------------------------------------
def test_a_claim_of_another_pid_namespace_on_the_same_host_is_left_to_its_heartbeat(tmp_path, monkeypatch):
    # a live worker in another container with the same host name: its PID means nothing here
    import multiprocessing

    board = ClaimBoard(f"sqlite:///{tmp_path / 'claims.db'}")
    board.register("c", SLUG, ["p0"])
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
    child.start()
    child.join()
    with monkeypatch.context() as patch:  # the other container: another PID namespace, a PID not running here
        patch.setattr("autogemm.campaigns.claims.os.getpid", lambda: child.pid)
        patch.setattr("autogemm.campaigns.claims.identity", lambda: ("boot-id", "4026531999"))
        theirs = new_owner()
    assert board.claim("c", SLUG, theirs, grace=600) == "p0"
    assert board.claim("c", SLUG, new_owner(), grace=600) is None
    board.close()


def test_a_claim_in_an_unknown_state_does_not_make_claim_spin(tmp_path):
    board = ClaimBoard(f"sqlite:///{tmp_path / 'claims.db'}")
    board.register("c", SLUG, ["p0", "p1"])
    with board.engine.begin() as db:
        db.execute(claims_table.update().where(claims_table.c.problem == "p0").values(state="paused", heartbeat=0.0))
        db.execute(claims_table.update().where(claims_table.c.problem == "p1").values(state=ClaimState.DONE))
    found = []
    worker = threading.Thread(target=lambda: found.append(board.claim("c", SLUG, new_owner(), grace=1.0)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    spinning = worker.is_alive()
    if spinning:  # stop it: its next query fails
        board.engine.dispose()
        board.engine = None
        worker.join(timeout=10)
    assert not spinning and found == [None]


# ---- studies another version wrote; storage failures -------------------------------------------
def test_a_trial_this_version_cannot_read_is_skipped_with_a_warning(tmp_path):
    from optuna.distributions import CategoricalDistribution

    from autogemm.tuning.tuner import tune

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(study_name="old", storage=storage, direction="maximize")
    study.add_trial(optuna.trial.create_trial(params={"bk": 8}, distributions={"bk": CategoricalDistribution((8, 16))},
                                              value=1e6, user_attrs={"config": "simt_from_version_0_9"}))
    with pytest.warns(UserWarning, match="simt_from_version_0_9"):
        result = tune(TABLE.problem, trials=6, timeout=None, space=SPACE_PATH, storage=storage, study_name="old",
                      evaluator=RecordedEvaluator(TABLE), cache=TuningCache(tmp_path / "tuned", shipped=False))
    assert result.valid == 6 and result.config.name != "simt_from_version_0_9"


class _Events:
    def __init__(self):
        self.seen = []

    def put(self, event):
        self.seen.append(event)


def test_a_storage_failure_gives_the_claim_back_for_a_rerun(tmp_path, monkeypatch):
    import sqlalchemy as sa

    from autogemm.campaigns.worker import WorkerSpec, _claim_and_tune

    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    optuna.create_study(storage=storage, study_name="x")
    engine = sa.create_engine(storage)
    with engine.begin() as db:  # the studies cannot be opened (another Optuna version's schema)
        db.execute(sa.text("UPDATE alembic_version SET version_num = 'v99.0.0.from-the-future'"))
    engine.dispose()
    campaign = parse_campaign({"campaign": {"name": "c", "storage": storage, "trials": 4, "cache_dir": str(tmp_path / "c")},
                               "problems": [{"shapes": [[4096, 4096, 1024]]}]})
    events = _Events()
    _claim_and_tune(WorkerSpec(campaign, storage, "W0", None, 1, ReplayFactory(), str(SPACE_PATH)), events)
    (claim,) = ClaimBoard(storage).claims("c")
    assert (claim.state, claim.owner, claim.result) == (ClaimState.OPEN, None, None), claim
    assert [e[0] for e in events.seen if e[0] not in ("ready", "start")] == ["skipped"]
    assert "study storage" in events.seen[-1][3]


# ---- readers create nothing -----------------------------------------------------------------
def test_report_never_creates_nor_alters_a_schema(tmp_path, capsys, postgres_url):  # noqa: F811
    import sqlalchemy as sa

    pytest.importorskip("plotly")
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for storage in (postgres_url, f"sqlite:///{empty}"):
        code, _, err = run_cli(capsys, "report", "--all", "--storage", storage, "-o", str(tmp_path / "r.html"))
        assert code == 2 and "holds no Optuna studies" in err, err
        engine = sa.create_engine(storage)
        assert sa.inspect(engine).get_table_names() == []
        engine.dispose()
    assert empty.read_bytes() == b""
    # Optuna's tables without their version rows: read as they are, never completed
    engine = sa.create_engine(postgres_url)
    from optuna.storages._rdb import models

    models.BaseModel.metadata.create_all(engine)
    with engine.connect() as db:
        before = {t: db.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar() for t in ("version_info", "alembic_version")
                  if sa.inspect(engine).has_table(t)}
    code, _, err = run_cli(capsys, "report", "--all", "--storage", postgres_url, "-o", str(tmp_path / "r.html"))
    assert code == 2, err
    with engine.connect() as db:
        after = {t: db.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar() for t in before}
    engine.dispose()
    assert after == before


def test_the_report_page_shows_the_storage_as_given(tmp_path, capsys, monkeypatch):
    pytest.importorskip("plotly")
    from autogemm.tuning.tuner import tune

    user = tmp_path / "home-of-someone" / "cache"
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(user))
    tune(TABLE.problem, trials=3, timeout=None, space=SPACE_PATH, evaluator=RecordedEvaluator(TABLE),
         cache=TuningCache(tmp_path / "tuned", shipped=False))
    page = tmp_path / "r.html"
    code, _, err = run_cli(capsys, "report", "--all", "-o", str(page))
    assert code == 0, err
    text = page.read_text()
    assert "home-of-someone" not in text and "the default study storage" in text
    monkeypatch.chdir(user)
    code, _, err = run_cli(capsys, "report", "--all", "--storage", "sqlite:///studies.db", "-o", str(page))
    assert code == 0, err
    assert "home-of-someone" not in page.read_text() and "sqlite:///studies.db" in page.read_text()


def _status_file(tmp_path: Path, storage: str | None, shapes) -> Path:
    path = tmp_path / "c.toml"
    storage_line = f'storage = "{storage}"\n' if storage else ""
    path.write_text(f'[campaign]\nname = "c"\n{storage_line}cache_dir = "cache"\n[[problems]]\nshapes = {shapes}\n')
    return path


def test_campaign_status_counts_every_problem_and_the_cache_and_creates_nothing(tmp_path, capsys, monkeypatch):
    user = tmp_path / "user"
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(user))
    path = _status_file(tmp_path, None, [[64, 64, 64], [96, 96, 96], [128, 128, 128]])
    code, out, err = run_cli(capsys, "campaign", "status", str(path))
    assert code == 0 and "0 of 3 problem(s) done" in err, err
    assert not user.exists() or not any(user.rglob("*"))  # no studies.db where it only read
    # a problem finished in the campaign's cache counts as done (a worker would take it as done)
    TuningCache(tmp_path / "cache", shipped=False).store(make_record(64), SLUG)
    code, out, err = run_cli(capsys, "campaign", "status", str(path), "--json")
    assert code == 0 and "1 of 3 problem(s) done" in err, err
    rows = json.loads(out)["results"]
    assert [(r["device"], r["problem"], r["done"]) for r in rows] == [(SLUG, KEY, True)]
    assert not user.exists() or not any(user.rglob("*"))
    # the board and the cache together; a board problem done in the cache is done
    storage = f"sqlite:///{tmp_path / 'board.db'}"
    path = _status_file(tmp_path, storage, [[64, 64, 64], [96, 96, 96], [128, 128, 128]])
    board = ClaimBoard(storage)
    board.register("c", SLUG, [KEY, "float32/fp32/nn/b1/96x96x96", "float32/fp32/nn/b1/128x128x128"])
    board.close()
    before = (tmp_path / "board.db").read_bytes()
    code, out, err = run_cli(capsys, "campaign", "status", str(path))
    assert code == 0 and "1 of 3 problem(s) done" in err, err
    assert (tmp_path / "board.db").read_bytes() == before
    code, _, err = run_cli(capsys, "campaign", "status", str(_status_file(tmp_path, f"sqlite:///{tmp_path / 'none.db'}",
                                                                           [[64, 64, 64]])))
    assert code == 0 and not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("result", ['{"error": 5, "tflops": "x", "config": 7, "ratio": [1], "host": null}',
                                    '[1, 2]', '"just text"', 'not json {', '{"cublas_tflops": 1e999}'])
def test_a_stored_result_of_another_shape_does_not_crash_status(tmp_path, capsys, monkeypatch, result):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    storage = f"sqlite:///{tmp_path / 'board.db'}"
    path = _status_file(tmp_path, storage, [[64, 64, 64]])
    board = ClaimBoard(storage)
    board.register("c", SLUG, [KEY])
    with board.engine.begin() as db:
        db.execute(claims_table.update().values(state=ClaimState.DONE, result=result))
    board.close()
    code, out, err = run_cli(capsys, "campaign", "status", str(path))
    assert code == 0 and "Traceback" not in err and KEY in out, err
    code, out, err = run_cli(capsys, "campaign", "status", str(path), "--json")
    assert code == 0, err
    (row,) = json.loads(out)["results"]
    assert isinstance(row["error"], str) and row["tflops"] is None and row["ratio"] is None
    assert row["cublas_tflops"] is None  # (JSON has no infinity)


# ---- the command line ------------------------------------------------------------------------
def test_campaign_actions_are_subcommands_with_their_own_help_and_flags(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    path = _status_file(tmp_path, None, [[64, 64, 64]])
    helps = {}
    for action in ("run", "status", "export"):
        code, out, _ = run_cli(capsys, "campaign", action, "--help")
        assert code == 0
        helps[action] = out
    assert "--stop-after" in helps["run"] and "--jobs" in helps["run"]
    assert "--stop-after" not in helps["status"] and "--jobs" not in helps["status"]
    assert "--output" in helps["export"] and "--stop-after" not in helps["export"] and "--json" not in helps["export"]
    for argv in (("status", str(path), "--stop-after", "5"), ("status", str(path), "--jobs", "2"),
                 ("export", str(path), "--json", "-o", str(tmp_path / "x.json")), ("run", str(path), "-o", "x")):
        code, _, err = run_cli(capsys, "campaign", *argv)
        assert code == 2 and "unrecognized arguments" in err, argv
    code, _, err = run_cli(capsys, "campaign", "status", str(path), "--json")  # as before
    assert code == 0, err


# ---- fuzz: every campaign file is refused, naming its fault, or read; quickly, in little memory -----
KNOWN_FAULTS = ("campaign.", "problems[", "[campaign]", "[[problems]]", "top-level keys", "not valid TOML",
                "cannot read campaign file", "the campaign makes", "bytes (at most")

_VALUES = [0, 1, -1, 7, 64, 2 ** 31, 2 ** 32, 2 ** 63 - 1, -(2 ** 63), 1.5, 0.0, -0.0, 1e-300, 1e300, math.inf, -math.inf,
           math.nan, True, False, "", "x", "all", "nn", "tn", "float16", "bfloat16", "fp32", "tf32", "GPU-1234abcd-0",
           "sqlite:///:memory:", "sqlite:///s.db", "journal:///j.log", "postgresql://u:p@h/d", "../x", "/abs", "~/x",
           "\x00", [], [1], [[1, 2, 3]], [0, 1], {"a": 1}]


def _sizes(rng: random.Random, largest: int = 5000):
    count = rng.choice((1, 1, 1, 2, 3, 5, 10, 20)) if rng.random() < 0.93 else rng.choice((100, 700))
    values = [rng.randint(1, largest) for _ in range(count)]
    return values[0] if count == 1 and rng.random() < 0.5 else values


# values a key takes in a file that should be read (each document spoils a few of them)
_GOOD = {
    "storage": lambda rng: rng.choice(["sqlite:///s.db", "journal:///j.log", "postgresql://u@h/d",
                                       "postgresql+psycopg2://u:pw@h:5432/d"]),
    "devices": lambda rng: rng.choice(["all", [0], [0, 1], ["GPU-8c1e1ad4-0000-0000-0000-000000000000"]]),
    "timeout": lambda rng: rng.choice([1, 20, 0.5, 600.0, 86400]),
    "trials": lambda rng: rng.choice([1, 30, 400, 10000]),
    "seed": lambda rng: rng.choice([0, 1, 2 ** 32 - 1, 12345]),
    "grace": lambda rng: rng.choice([1, 1.5, 60, 120.0, 3600]),
    "patience": lambda rng: rng.choice([0, 10, 100]),
    "cache_dir": lambda rng: rng.choice(["cache", "a/b", "."]),
    "M": _sizes, "N": _sizes, "K": _sizes, "batch": lambda rng: _sizes(rng, 8),
    "shapes": lambda rng: [[rng.randint(1, 9000) for _ in range(3)] for _ in range(rng.randint(1, 40))],
    "dtype": lambda rng: rng.choice(["float32", "float16", ["float16", "bfloat16"], "float64"]),
    "compute": lambda rng: rng.choice(["", "fp32", "tf32"]),
    "layout": lambda rng: rng.choice(["nn", "NT", ["nn", "tt"]]),
}


def _value(rng: random.Random, key: str):
    if key in _GOOD and rng.random() < 0.85:
        return _GOOD[key](rng)
    roll = rng.random()
    if roll < 0.6:
        return rng.choice(_VALUES)
    if roll < 0.8:
        return _sizes(rng)
    if roll < 0.9:
        return [[rng.randint(0, 4096) for _ in range(rng.choice((2, 3, 3, 4)))] for _ in range(rng.randint(1, 50))]
    return "".join(rng.choice("ab:/@.\\\"'é-_ ") for _ in range(rng.randint(0, 30)))


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if value != value else ("inf" if value == math.inf else "-inf" if value == -math.inf else repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"


def _document(rng: random.Random) -> str:
    head_keys = ["name", "storage", "devices", "timeout", "trials", "seed", "grace", "patience", "cache_dir", "budget"]
    problem_keys = ["M", "N", "K", "shapes", "dtype", "compute", "layout", "batch", "colour"]
    lines = []
    if rng.random() < 0.97:
        lines.append("[campaign]")
        if rng.random() < 0.95:
            lines.append(f"name = {_toml(rng.choice(['ok'] * 12 + ['run-1.2', 'a b', '', 'x' * 80, 7]))}")
        for key in rng.sample(head_keys[1:], rng.randint(0, 5)):
            if key != "budget" or rng.random() < 0.2:
                lines.append(f"{key} = {_toml(_value(rng, key))}")
    for _ in range(rng.choice((0, 1, 1, 1, 2, 3)) if rng.random() < 0.95 else 40):
        lines.append("[[problems]]")
        keys = rng.choice([["M"], ["M", "N"], ["M", "N", "K"], ["shapes"]]) if rng.random() < 0.8 else []
        for key in dict.fromkeys(keys + rng.sample(problem_keys, rng.randint(0, 3))):
            if key != "colour" or rng.random() < 0.2:
                lines.append(f"{key} = {_toml(_value(rng, key))}")
    text = "\n".join(lines) + "\n"
    if rng.random() < 0.05:  # broken TOML
        cut = rng.randrange(len(text) + 1)
        text = text[:cut] + rng.choice(["[", "= =", "\x00", "[[[[", "'''"]) + text[cut:]
    return text


CRAFTED = [
    '[campaign]\nname = "x"\n[[problems]]\nM = ' + "[" * 5000 + "]" * 5000 + "\n",  # nested deeper than the parser goes
    '[campaign]\nname = "x"\nstorage = "sqlite:///:memory:"\n[[problems]]\nM = 1\n',
    '[campaign]\nname = "x"\n' + "[[problems]]\nM = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nN = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" * 200,
    '[campaign]\nname = "x"\n[[problems]]\nM = ' + str(list(range(1, 40001))) + "\n",  # a long list, under 256 KiB
    '[campaign]\nname = "x"\n[[problems]]\nshapes = ' + str([[1, 1, 1]] * 20000) + "\n",  # dense: the slowest to parse
    '[campaign]\nname = "x"\n[[problems]]\nM = 8\ndtype = ' + json.dumps(["float16"] * 20000) + "\n",
    '[campaign]\nname = "x"\n[[problems]]\nM = [1, 2, 3, 4]\nN = ' + str(list(range(1, 51))) + "\nK = "
    + str(list(range(1, 26))) + '\nlayout = ["nn", "tt"]\n',  # exactly at the limit: read
    '[campaign]\nname = "x"\n# padding\n' + "#" * (2 << 20) + "\n[[problems]]\nM = 1\n",  # a file too big
    '[campaign]\nname = "x"\ncache_dir = "../../etc"\n[[problems]]\nM = 1\n',
    '[campaign]\nname = "x"\ngrace = inf\n[[problems]]\nM = 1\n',
    '[campaign]\nname = "x"\nseed = 4294967296\n[[problems]]\nM = 1\n',
]

# Each document is read in a fresh interpreter: its time measured alone, and its memory as the
# growth of the process's peak resident size over what the interpreter held before (tracemalloc
# would slow Python's TOML parser ninefold)
_FUZZ_CHILD = """
import json, resource, sys, time
from pathlib import Path
from autogemm.campaigns.file import CampaignFileError, load_campaign

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

folder = Path(sys.argv[1])
load_campaign(folder / "warm-up.toml")
baseline, results = peak(), []
for path in sorted(folder.glob("d*.toml"), key=lambda p: int(p.stem[1:])):
    started = time.perf_counter()
    try:
        campaign = load_campaign(path)
        facts = [len(campaign.problems), campaign.tune_options.seed, campaign.grace, campaign.tune_options.timeout,
                 campaign.storage, campaign.cache_dir]
        verdict, message = "read", ""
    except CampaignFileError as exc:
        facts, verdict, message = None, "refused", str(exc)
    results.append([int(path.stem[1:]), verdict, message[:300], time.perf_counter() - started, peak() - baseline, facts])
print(json.dumps(results))
"""


def test_fuzzed_campaign_files_are_refused_with_their_key_named_or_read(tmp_path):
    rng = random.Random(36)
    documents = CRAFTED + [_document(rng) for _ in range(320)]
    folder = tmp_path / "fuzz"
    folder.mkdir()
    (folder / "warm-up.toml").write_text('[campaign]\nname = "w"\n[[problems]]\nM = [1, 2]\n')
    for index, text in enumerate(documents):
        (folder / f"d{index}.toml").write_text(text, encoding="utf-8", errors="surrogatepass")
    child = subprocess.run([sys.executable, "-c", _FUZZ_CHILD, str(folder)], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert child.returncode == 0, child.stderr[-3000:]
    results = json.loads(child.stdout)
    assert [r[0] for r in results] == list(range(len(documents))) and len(documents) >= 300
    for index, verdict, message, seconds, grown, facts in results:
        where = (index, documents[index][:200], message)
        assert seconds < 2.0 and grown < 200e6, (*where, seconds, grown)
        if verdict == "refused":
            assert any(fault in message for fault in KNOWN_FAULTS), where
        else:
            problems, seed, grace, timeout, storage, cache_dir = facts
            assert 1 <= problems <= MAX_PROBLEMS and 0 <= seed < 2 ** 32, where
            assert 1.0 <= grace <= 7 * 86400 and 0 < timeout <= 7 * 86400, where
            assert storage is None or ":memory:" not in storage, where
            assert cache_dir is None or Path(cache_dir).is_relative_to(folder.resolve()), where
    verdicts = [r[1] for r in results]
    assert verdicts.count("read") >= 10 and verdicts.count("refused") >= 100  # the fuzz reaches both
    assert results[6][1] == "read" and results[6][5][0] == MAX_PROBLEMS


# ---- the host name in claims -------------------------------------------------------------------
def test_a_host_name_given_for_claims_names_the_owner_and_decides_who_takes_a_dead_claim(monkeypatch):
    """AUTOGEMM_HOST_NAME stands for the host name in claims: a dead process's claim is taken at once
    only by a worker of the same name (and boot and PID namespace); a worker of another name waits for
    the heartbeat, as another machine's would."""
    from autogemm.campaigns import claims

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    monkeypatch.setenv("AUTOGEMM_HOST_NAME", "alpha")
    owner = claims.new_owner()
    assert owner.startswith("alpha:")
    boot, namespace = claims.identity()
    if not boot:
        pytest.skip("no boot id or PID namespace to read here (not Linux)")
    dead_owner = f"alpha:{boot}:{namespace}:{pid}:token"
    assert claims._owner_is_dead_here(dead_owner)
    monkeypatch.setenv("AUTOGEMM_HOST_NAME", "beta")
    assert not claims._owner_is_dead_here(dead_owner)


@pytest.mark.parametrize("name", ["", "a:b", "-x", "x" * 129, "name with space", "é"])
def test_a_host_name_claims_cannot_carry_is_refused_before_any_worker_starts(monkeypatch, tmp_path, name):
    from autogemm.campaigns import claims
    from autogemm.campaigns.campaign import CampaignError, run_campaign

    monkeypatch.setenv("AUTOGEMM_HOST_NAME", name)
    with pytest.raises(claims.HostNameError, match="AUTOGEMM_HOST_NAME"):
        claims.new_owner()
    with pytest.raises(CampaignError, match="AUTOGEMM_HOST_NAME"):
        run_campaign(None, [])
