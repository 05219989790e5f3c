"""Campaigns without a GPU: the campaign file, the claim board on SQLite and on a real PostgreSQL
server (started by the tests with pgserver), workers as separate processes replaying a recorded
table, a worker killed with SIGKILL and its claim taken over, and the journal file storage."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import re
import signal
import threading
import time
import uuid
from pathlib import Path

import optuna
import pytest

from autogemm.results.cache import TuningCache
from autogemm.results.merge import merge_files
from autogemm.campaigns.campaign import board_records, board_summary, run_campaign, select_gpus, Gpu, CampaignError
from autogemm.campaigns.worker import WorkerSpec, worker_main
from autogemm.campaigns.file import CampaignFileError, load_campaign, parse_campaign
from autogemm.campaigns.claims import ClaimBoard, ClaimState, new_owner
from autogemm.problem import Problem

from campaign_helpers import SPACE_PATH, ReplayFactory
from test_cache import make_record

SLUG = "nvidia-h200-sm90"  # the recorded table's device


# ---- PostgreSQL: a real server, one per test session, a fresh database per test -------------------
_SERVER: dict = {}  # the session's one server, shared by the test modules that import these fixtures


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory):
    import pgserver

    if not _SERVER:
        _SERVER.update(server=pgserver.get_server(str(tmp_path_factory.mktemp("pgdata")), cleanup_mode="stop"), users=0)
    _SERVER["users"] += 1
    yield _SERVER["server"]
    _SERVER["users"] -= 1
    if not _SERVER["users"]:
        _SERVER.pop("server").cleanup()
        _SERVER.clear()


@pytest.fixture
def postgres_url(postgres_server):
    import sqlalchemy as sa

    base = postgres_server.get_uri().replace("postgresql://", "postgresql+psycopg2://", 1)
    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with engine.connect() as db:
        db.execute(sa.text(f"CREATE DATABASE {name}"))
        version = db.execute(sa.text("select version()")).scalar()
    engine.dispose()
    assert version.startswith("PostgreSQL")
    return base.replace("/postgres?", f"/{name}?", 1)


def test_the_postgres_server_is_real(postgres_url):
    import sqlalchemy as sa

    engine = sa.create_engine(postgres_url)
    with engine.connect() as db:
        assert db.execute(sa.text("select current_database()")).scalar().startswith("t_")
        assert int(db.execute(sa.text("show server_version_num")).scalar()) >= 120000
    engine.dispose()


# ---- the campaign file ---------------------------------------------------------------------------
def test_grids_expand_with_n_and_k_defaulting_to_m_and_duplicates_once():
    campaign = parse_campaign({
        "campaign": {"name": "llm", "timeout": 5, "trials": 30},
        "problems": [
            {"M": [1, 16], "N": [4096, 11008], "K": 4096, "dtype": ["float16", "bfloat16"]},
            {"M": 512},  # 512^3 float32
            {"shapes": [[127, 4096, 4096], [512, 512, 512]], "layout": ["nn", "tn"]},
        ]})
    keys = [p.key for p in campaign.problems]
    assert len(keys) == 8 + 1 + 3  # 512^3 float32 nn is listed twice and kept once
    assert "float16/fp32/nn/b1/16x11008x4096" in keys and "bfloat16/fp32/nn/b1/1x4096x4096" in keys
    assert "float32/fp32/nn/b1/512x512x512" in keys and "float32/fp32/tn/b1/127x4096x4096" in keys
    assert (campaign.tune_options.timeout, campaign.tune_options.trials, campaign.devices) == (5.0, 30, "all")


def test_grouped_problems_expand_over_their_groups_and_routing_buckets():
    campaign = parse_campaign({
        "campaign": {"name": "moe"},
        "problems": [{"M": [4096, 65536], "N": 768, "K": 2048, "groups": 128, "routing": ["uniform", "skewed"],
                      "dtype": "bfloat16", "layout": "nt"},
                     {"M": 4096, "N": 14336, "K": 4096, "groups": [8], "dtype": "bfloat16", "layout": "nt"}]})
    keys = [p.key for p in campaign.problems]
    assert len(keys) == 5 and all(p.grouped for p in campaign.problems)
    assert "bfloat16/fp32/nt/g128-skewed/65536x768x2048" in keys and "bfloat16/fp32/nt/g8-uniform/4096x14336x4096" in keys
    shipped = load_campaign(Path(__file__).resolve().parent.parent / "campaigns" / "grouped.toml")
    assert len(shipped.problems) == 12 and {p.routing for p in shipped.problems} == {"uniform", "skewed"}


@pytest.mark.parametrize("data, fault", [
    ({"problems": [{"M": 1}]}, "[campaign] table"),
    ({"campaign": {"name": "a b"}, "problems": [{"M": 1}]}, "campaign.name"),
    ({"campaign": {"name": "x"}}, "[[problems]]"),
    ({"campaign": {"name": "x", "budget": 3}, "problems": [{"M": 1}]}, "unknown keys budget"),
    ({"campaign": {"name": "x"}, "problems": [{"M": 0}]}, "problems[0].M must be a positive integer"),
    ({"campaign": {"name": "x"}, "problems": [{"M": 8, "layout": "nx"}]}, "problems[0].layout"),
    ({"campaign": {"name": "x"}, "problems": [{"M": 8, "dtype": "int7"}]}, "problems[0]"),
    ({"campaign": {"name": "x"}, "problems": [{"M": 8, "shapes": [[1, 2, 3]]}]}, "both shapes and M/N/K"),
    ({"campaign": {"name": "x"}, "problems": [{"N": 8}]}, "needs M"),
    ({"campaign": {"name": "x", "storage": "redis://h"}, "problems": [{"M": 8}]}, "campaign.storage"),
    ({"campaign": {"name": "x", "devices": [0, 0]}, "problems": [{"M": 8}]}, "names a GPU twice"),
    ({"campaign": {"name": "x", "devices": ["../etc"]}, "problems": [{"M": 8}]}, "campaign.devices"),
    ({"campaign": {"name": "x", "timeout": -1}, "problems": [{"M": 8}]}, "campaign.timeout"),
    ({"campaign": {"name": "x", "seed": 1.5}, "problems": [{"M": 8}]}, "campaign.seed"),
    ({"campaign": {"name": "x"}, "problems": [{"M": 8, "groups": 4, "batch": 2}]}, "both groups"),
    ({"campaign": {"name": "x"}, "problems": [{"M": 8, "routing": "skewed"}]}, "give groups too"),
    ({"campaign": {"name": "x"}, "problems": [{"M": 8, "groups": 4, "routing": "zipf"}]}, "problems[0].routing"),
    ({"campaign": {"name": "x"}, "problems": [{"M": 8, "groups": 4}]}, "grouped products are tuned in"),  # float32
])
def test_a_bad_campaign_file_is_refused_with_its_fault_named(data, fault):
    with pytest.raises(CampaignFileError, match=fault.replace("[", r"\[").replace("]", r"\]")):
        parse_campaign(data)


def test_a_campaign_file_names_the_file_in_its_errors_and_resolves_its_cache_dir(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[campaign\nname=1")
    with pytest.raises(CampaignFileError, match="bad.toml is not valid TOML"):
        load_campaign(bad)
    with pytest.raises(CampaignFileError, match="no such campaign file"):
        load_campaign(tmp_path / "missing.toml")
    good = tmp_path / "sub" / "c.toml"
    good.parent.mkdir()
    good.write_text('[campaign]\nname = "c"\ncache_dir = "shipped"\n[[problems]]\nM = 64\n')
    assert load_campaign(good).cache_dir == str(good.parent / "shipped")


def test_gpus_are_chosen_by_index_or_uuid_and_an_unknown_one_is_named():
    gpus = [Gpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "H200"),
            Gpu(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", "H200")]
    assert select_gpus("all", gpus) == gpus
    assert select_gpus(("GPU-BBBBBBBB-0000-0000-0000-000000000000",), gpus) == [gpus[1]]
    with pytest.raises(CampaignError, match="names GPU 3"):
        select_gpus((3,), gpus)
    from autogemm.gpu.runtime import GpuUnavailable

    with pytest.raises(GpuUnavailable, match="no CUDA GPU is usable on this host .the CUDA driver sees no device"):
        select_gpus("all", [])


# ---- the claim board -----------------------------------------------------------------------------
def _board_urls(tmp_path, postgres_url):
    return {"sqlite": f"sqlite:///{tmp_path / 'claims.db'}", "postgresql": postgres_url}


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_claims_go_once_each_and_a_late_claim_is_taken_over(kind, tmp_path, postgres_url):
    board = ClaimBoard(_board_urls(tmp_path, postgres_url)[kind])
    problems = ["p0", "p1", "p2"]
    assert board.register("c", SLUG, problems) == 3
    assert board.register("c", SLUG, problems) == 0  # registering again adds nothing
    first, second = new_owner(), "elsewhere:1:x"
    assert board.claim("c", SLUG, first, grace=60) == "p0"
    assert board.claim("c", SLUG, second, grace=60) == "p1"
    assert board.claim("c", "other-gpu-sm90", second, grace=60) is None  # another device model's board is empty
    assert board.finish("c", SLUG, "p0", first, {"ratio": 1.1})
    assert not board.finish("c", SLUG, "p1", first, {"ratio": 1.0})  # not its claim
    assert board.release("c", SLUG, "p1", second)
    assert board.claim("c", SLUG, first, grace=60) == "p1"
    assert board.claim("c", SLUG, second, grace=60) == "p2"
    assert board.claim("c", SLUG, first, grace=60) is None  # p2 is held, with a fresh heartbeat
    time.sleep(1.2)
    assert board.heartbeat("c", SLUG, "p1", first)  # p1 renewed, p2 not
    assert board.claim("c", SLUG, first, grace=1.0) == "p2"  # taken over from the silent holder
    assert not board.heartbeat("c", SLUG, "p2", second)  # the old holder learns it lost it
    states = {c.problem: (c.state, c.attempts) for c in board.claims("c")}
    assert states == {"p0": (ClaimState.DONE, 1), "p1": (ClaimState.CLAIMED, 2), "p2": (ClaimState.CLAIMED, 2)}
    board.close()


def _claim_all(url: str, results: list, lock: threading.Lock) -> None:
    board = ClaimBoard(url)
    owner = new_owner() + uuid.uuid4().hex[:4]
    while (key := board.claim("race", SLUG, owner, grace=600)) is not None:
        with lock:
            results.append(key)
    board.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_racing_workers_never_claim_a_problem_twice(kind, tmp_path, postgres_url):
    url = _board_urls(tmp_path, postgres_url)[kind]
    problems = [f"p{i}" for i in range(60)]
    ClaimBoard(url).register("race", SLUG, problems)
    results, lock = [], threading.Lock()
    threads = [threading.Thread(target=_claim_all, args=(url, results, lock)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(problems)


def test_a_claim_of_a_dead_process_of_this_host_is_taken_over_at_once(tmp_path):
    board = ClaimBoard(f"sqlite:///{tmp_path / 'claims.db'}")
    board.register("c", SLUG, ["p0"])
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
    child.start()
    child.join()
    host = new_owner().rsplit(":", 2)[0]
    assert board.claim("c", SLUG, f"{host}:{child.pid}:dead", grace=600) == "p0"
    assert board.claim("c", SLUG, new_owner(), grace=600) == "p0"  # its process is gone


def test_journal_storages_keep_their_claims_beside_the_journal(tmp_path):
    board = ClaimBoard(f"journal:///{tmp_path / 'studies.log'}")
    board.register("c", SLUG, ["p0"])
    assert (tmp_path / "studies.log.claims.db").exists()
    board.close()


# ---- workers as processes ------------------------------------------------------------------------
PROBLEMS = [Problem(4096, 4096, k) for k in (1024, 2048, 4096, 8192)] + [Problem(2048, 4096, 4096)]


def _campaign(storage: str, cache_dir: Path, trials: int = 8, grace: float = 60.0):
    return parse_campaign({
        "campaign": {"name": "replay", "storage": storage, "trials": trials, "timeout": 600, "grace": grace,
                      "seed": 1, "cache_dir": str(cache_dir)},
        "problems": [{"shapes": [[p.m, p.n, p.k] for p in PROBLEMS]}]})


def _specs(campaign, storage, count, delay=0.0):
    # (the workers share one compile pool, as a GPU campaign's do: the wiring is exercised, though
    # replayed candidates compile nothing)
    return [WorkerSpec(campaign, storage, f"W{i}", None, 1, ReplayFactory(delay), str(SPACE_PATH), share_compiles=True)
            for i in range(count)]


class _Events:
    def __init__(self):
        self.seen = []

    def event(self, event):
        self.seen.append(event)

    def tick(self):
        pass


def _studies(storage: str) -> list:
    from autogemm.tuning.study import storage_object

    return [optuna.load_study(study_name=s.study_name, storage=storage_object(storage))
            for s in optuna.get_all_study_summaries(storage=storage_object(storage))]


@pytest.mark.parametrize("kind", ["postgresql", "journal"])
def test_two_worker_processes_tune_every_problem_exactly_once(kind, tmp_path, postgres_url, monkeypatch):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    storage = postgres_url if kind == "postgresql" else f"journal:///{tmp_path / 'studies.log'}"
    caches = [tmp_path / "host-a", tmp_path / "host-b"]
    # two "hosts" (each its own cache directory) sharing one storage, a worker each
    campaigns = [_campaign(storage, cache) for cache in caches]
    events = _Events()
    threads = [threading.Thread(target=lambda c=c: run_campaign(c, _specs(c, storage, 1), events)) for c in campaigns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    board = ClaimBoard(storage)
    rows = board_summary(board, campaigns[0])
    assert sorted(r["problem"] for r in rows) == sorted(p.key for p in PROBLEMS)
    assert all(r["state"] == ClaimState.DONE and r["attempts"] == 1 and (r["ratio"] or 0) > 0 for r in rows), \
        [(r["problem"], r["state"], r["ratio"], r["error"]) for r in rows]
    done_events = [e for e in events.seen if e[0] == "done"]
    assert sorted(e[2] for e in done_events) == sorted(p.key for p in PROBLEMS)  # each once, by one worker
    # every trial a worker measured is in the storage, finished (none left RUNNING)
    studies = _studies(storage)
    assert len(studies) == len(PROBLEMS)
    for study in studies:
        states = [t.state for t in study.get_trials(deepcopy=False)]
        assert optuna.trial.TrialState.RUNNING not in states
        assert sum(s == optuna.trial.TrialState.COMPLETE for s in states) >= 8
    # the two hosts' caches merge into one document holding every best
    merged = tmp_path / "merged.json"
    sources = [c / f"{SLUG}.json" for c in caches if (c / f"{SLUG}.json").exists()]
    assert merge_files(sources, merged) == {SLUG: len(PROBLEMS)}
    document = json.loads(merged.read_text())
    best = {r["problem"]: r for r in rows}
    for key, entry in document["entries"].items():
        assert entry["ratio"] == pytest.approx(best[key]["ratio"] if not best[key]["kept_cublas"] else 1.0)
        assert entry["host"] and entry["versions"]["autogemm"]
    # the board holds every host's records too: exported, they are the same bests
    exported = board_records(board, campaigns[0])
    assert set(exported) == {SLUG} and set(exported[SLUG]) == set(document["entries"])
    for key, entry in exported[SLUG].items():
        assert entry["ratio"] == document["entries"][key]["ratio"]
    board.close()


def test_a_worker_with_nothing_to_claim_helps_the_holder_search_its_study(tmp_path, postgres_url, monkeypatch):
    # fewer problems than workers: the second worker joins the first one's study (trials tagged by
    # worker, taken into each other's search), and the holder alone re-times, caches and finishes
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    storage = postgres_url  # (the SQLite board runs the same statements: the claim tests cover both)
    problem = PROBLEMS[0]
    campaign = dataclasses.replace(_campaign(storage, tmp_path / "cache", trials=60), problems=(problem,))
    events = _Events()
    run_campaign(campaign, _specs(campaign, storage, 2, delay=0.1), events)
    board = ClaimBoard(storage)
    (claim,) = board.claims(campaign.name)
    assert claim.state == ClaimState.DONE and claim.attempts == 1 and claim.study is None
    assert [e[2] for e in events.seen if e[0] == "done"] == [problem.key]  # decided once, by the holder
    helping = [e for e in events.seen if e[0] == "helping"]
    assert helping and {e[2] for e in helping} == {problem.key}, [e[:3] for e in events.seen if e[0] != "trial"]
    (study,) = _studies(storage)
    assert study.study_name == helping[0][3]
    trials = study.get_trials(deepcopy=False)
    assert optuna.trial.TrialState.RUNNING not in [t.state for t in trials]
    measured = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and not t.user_attrs.get("duplicate")]
    by_worker = {}
    for t in measured:
        by_worker.setdefault(t.user_attrs["worker"], []).append(t)
    assert len(by_worker) == 2 and all(by_worker.values())  # both GPUs measured into the one study
    # and the problem's 60 trials were shared out: the holder measured fewer itself
    assert max(len(v) for v in by_worker.values()) < 60 <= len(measured) + 16  # (16: both lookaheads in flight)
    # the holder's record counts what the helper measured, and is the best of the whole study
    (record,) = [r for _, r in TuningCache(tmp_path / "cache", shipped=False).records(SLUG)]
    assert record.trials["other_gpus"] > 0
    best = max(measured, key=lambda t: t.value)
    assert record.config_name == best.user_attrs["config"] or record.is_cublas
    board.close()


def test_a_board_made_before_claims_named_their_study_gains_the_column(tmp_path):
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'claims.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as db:  # the table as the first campaigns created it
        db.execute(sa.text("CREATE TABLE autogemm_claims (campaign VARCHAR(64), device VARCHAR(128), "
                           "problem VARCHAR(128), position INTEGER NOT NULL, state VARCHAR(16) NOT NULL, "
                           "owner VARCHAR(255), heartbeat FLOAT, attempts INTEGER NOT NULL, finished FLOAT, "
                           "result TEXT, PRIMARY KEY (campaign, device, problem))"))
        db.execute(sa.text(f"INSERT INTO autogemm_claims VALUES ('c', '{SLUG}', 'p0', 0, 'open', NULL, NULL, 0, "
                           "NULL, NULL)"))
    engine.dispose()
    board = ClaimBoard(url)
    owner = new_owner()
    assert board.claim("c", SLUG, owner, grace=60) == "p0"
    assert board.announce("c", SLUG, "p0", owner, "a-study")
    assert [(c.problem, c.study) for c in board.helpable("c", SLUG, 60, "someone-else")] == [("p0", "a-study")]
    assert board.helpable("c", SLUG, 60, owner) == []  # never its own
    assert not board.announce("c", SLUG, "p0", "someone-else", "x")  # only the holder announces
    assert board.finish("c", SLUG, "p0", owner, {"ratio": 1.0})
    assert board.claims("c")[0].study is None and board.helpable("c", SLUG, 60, "someone-else") == []
    board.close()


def test_a_worker_past_its_stop_time_claims_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    campaign = _campaign(storage, tmp_path / "cache")
    spec = dataclasses.replace(_specs(campaign, storage, 1)[0], stop_at=time.time())
    run_campaign(campaign, [spec], _Events())
    assert {c.state for c in ClaimBoard(storage).claims(campaign.name)} == {ClaimState.OPEN}


def test_an_idle_worker_stops_waiting_once_a_held_problem_changes_but_not_on_a_heartbeat():
    # the last problem's holder finishes: the worker waiting with nothing to claim looks again at
    # once instead of sleeping out its pause (which kept a 2-GPU campaign open ~5 s longer)
    from autogemm.campaigns.worker import CHANGE_POLL_S, _wait_for_a_change
    from autogemm.campaigns.claims import Claim

    held = [Claim("c", "gpu", "float32/fp32/nn/b1/64x64x64", 0, ClaimState.CLAIMED, "other", time.time(), 1, None,
                  "study")]
    reads = []

    def finished_on_the_second_read():
        reads.append(time.monotonic())
        return held if len(reads) < 2 else []

    started = time.monotonic()
    _wait_for_a_change(finished_on_the_second_read, held, timeout=30.0)
    assert len(reads) == 2 and time.monotonic() - started < 2 * CHANGE_POLL_S + 1.0

    def heartbeat_renewed():
        return [dataclasses.replace(held[0], heartbeat=time.time())]

    started = time.monotonic()
    _wait_for_a_change(heartbeat_renewed, held, timeout=1.2)
    assert time.monotonic() - started >= 1.2


def test_a_worker_killed_on_one_host_has_its_claim_taken_over_by_another_and_its_trials_kept(
        tmp_path, postgres_url, monkeypatch):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    storage = postgres_url
    campaign = _campaign(storage, tmp_path / "cache", trials=12, grace=2.0)
    context = multiprocessing.get_context("spawn")
    events = context.Queue()
    # two "hosts" of this machine share the PostgreSQL server: a slow worker on host alpha, killed, and a
    # campaign on host beta, which sees alpha's death only through the claim's heartbeat
    slow = WorkerSpec(campaign, storage, "slow", None, 1, ReplayFactory(delay=0.25), str(SPACE_PATH))
    monkeypatch.setenv("AUTOGEMM_HOST_NAME", "alpha")
    victim = context.Process(target=worker_main, args=(slow, events))
    victim.start()
    deadline = time.monotonic() + 120
    trials_seen = 0
    while time.monotonic() < deadline and trials_seen < 3:
        event = events.get(timeout=120)
        trials_seen += event[0] == "trial"
    assert trials_seen >= 3
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    board = ClaimBoard(storage)
    held = [c for c in board.claims(campaign.name) if c.state == ClaimState.CLAIMED]
    assert len(held) == 1 and held[0].owner.startswith("alpha:")
    killed_problem = held[0].problem
    monkeypatch.setenv("AUTOGEMM_HOST_NAME", "beta")  # the takeover's workers: another host, so grace applies
    trials_before = {s.study_name: len(s.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) for s in _studies(storage)}
    assert sum(trials_before.values()) >= 1  # what it measured before it died is in the storage
    started = time.monotonic()
    run_campaign(campaign, _specs(campaign, storage, 1), _Events())
    rows = {r["problem"]: r for r in board_summary(board, campaign)}
    assert all(r["state"] == ClaimState.DONE for r in rows.values())
    assert rows[killed_problem]["attempts"] == 2 and time.monotonic() - started >= 1.0
    assert all(r["attempts"] == 1 for key, r in rows.items() if key != killed_problem)
    for study in _studies(storage):
        assert optuna.trial.TrialState.RUNNING not in [t.state for t in study.get_trials(deepcopy=False)]
        assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) >= trials_before.get(study.study_name, 0)
    cache = TuningCache(tmp_path / "cache", shipped=False)
    assert {r.problem for _, r in cache.records(SLUG)} == {p.key for p in PROBLEMS}
    board.close()


def test_campaign_run_and_status_from_the_command_line_report_an_unusable_file(tmp_path, capsys):
    from autogemm.cli import main

    bad = tmp_path / "c.toml"
    bad.write_text('[campaign]\nname = "x"\n[[problems]]\nM = [0]\n')
    assert main(["campaign", "status", str(bad)]) == 2
    assert "problems[0].M must be a positive integer" in capsys.readouterr().err


def test_campaign_status_prints_the_board(tmp_path, capsys, monkeypatch):
    from autogemm.cli import main

    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    path = tmp_path / "c.toml"
    path.write_text(f'[campaign]\nname = "replay"\nstorage = "{storage}"\n[[problems]]\nM = 64\n')
    board = ClaimBoard(storage)
    board.register("replay", SLUG, ["float32/fp32/nn/b1/64x64x64"])
    owner = new_owner()
    board.claim("replay", SLUG, owner, 60)
    board.finish("replay", SLUG, "float32/fp32/nn/b1/64x64x64", owner,
                 {"config": "simt_x", "tflops": 1.5, "cublas_tflops": 1.0, "ratio": 1.5, "host": "h1",
                  "kept_cublas": False})
    assert main(["campaign", "status", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["results"][0]["ratio"] == 1.5 and out["results"][0]["host"] == "h1"
    assert main(["campaign", "status", str(path)]) == 0
    table = capsys.readouterr().out
    assert "simt_x" in table and "1.500" in table and "h1" in table


def test_sigint_stops_the_campaign_keeping_the_best_and_a_rerun_resumes(tmp_path):
    import subprocess
    import sys

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    env = dict(os.environ, AUTOGEMM_CACHE_DIR=str(tmp_path / "user"),
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    child = [sys.executable, str(Path(__file__).parent / "campaign_child.py"), storage, str(tmp_path / "cache")]
    # started with SIGINT ignored, as a shell without job control starts its background commands
    # (how the campaign once ran to the end through a SIGINT)
    process = subprocess.Popen(child + ["0.3"], env=env, stdout=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    board = ClaimBoard(storage)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until the worker has claimed its first problem
        time.sleep(0.3)
        try:
            if any(c.state == ClaimState.CLAIMED for c in board.claims("interrupted")):
                break
        except Exception:  # the tables are not there yet
            continue
    # a few trials in: until the first verified kernel is cached (a fixed 1.5 s was not always
    # enough on a loaded machine, and then nothing was there to keep)
    cache = TuningCache(tmp_path / "cache", shipped=False)
    while time.monotonic() < deadline and not list(cache.records(SLUG)):
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=120)
    assert "INTERRUPTED" in out
    claims = board.claims("interrupted")
    assert [c.state for c in claims] == [ClaimState.OPEN, ClaimState.OPEN]  # the claim was given back at once
    kept = [r for _, r in cache.records(SLUG)]
    assert len(kept) == 1 and kept[0].provisional  # the best verified kernel so far is cached
    measured = sum(len(s.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) for s in _studies(storage))
    assert measured >= 1
    again = subprocess.run(child + ["0"], env=env, stdout=subprocess.PIPE, text=True, timeout=300)
    assert "DONE" in again.stdout
    claims = board.claims("interrupted")
    assert [c.state for c in claims] == [ClaimState.DONE, ClaimState.DONE] and claims[0].attempts == 2
    assert all(not r.provisional for _, r in cache.records(SLUG))
    board.close()


def test_storage_urls_are_shown_without_their_password():
    from autogemm.tuning.study import shown_url

    assert shown_url("postgresql+psycopg2://tuner:s3cret@db.example/autogemm") == \
        "postgresql+psycopg2://tuner:***@db.example/autogemm"
    assert shown_url("sqlite:////tmp/studies.db") == "sqlite:////tmp/studies.db"


def test_campaign_run_without_a_usable_gpu_says_so(tmp_path, capsys, monkeypatch):
    from conftest import gpu_available

    from autogemm.cli import main

    if gpu_available()[0]:
        pytest.skip("this machine has a GPU: the campaign would run")
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\nname = "x"\n[[problems]]\nM = 64\n')
    assert main(["campaign", "run", str(path)]) == 3
    err = capsys.readouterr().err
    assert "autogemm campaign run needs a CUDA GPU, and no CUDA GPU is usable on this host" in err
    assert "Traceback" not in err


def test_export_skips_what_is_not_a_valid_record_on_the_board(tmp_path):
    from autogemm.campaigns.campaign import board_records

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    campaign = _campaign(storage, tmp_path / "cache")
    board = ClaimBoard(storage)
    good = make_record(64)
    bad = dict(make_record(96).to_json(), ratio=-1)
    for slug, key, record in ((SLUG, good.problem, good.to_json()), (SLUG, bad["problem"], bad),
                              ("../../etc", good.problem, good.to_json())):
        board.register(campaign.name, slug, [key])
        owner = new_owner()
        assert board.claim(campaign.name, slug, owner, 60) == key
        board.finish(campaign.name, slug, key, owner, {"record": record})
    with pytest.warns(Warning):
        exported = board_records(board, campaign)
    assert exported == {SLUG: {good.problem: good.to_json()}}


def test_the_progress_view_writes_a_line_per_event_where_stderr_is_not_a_terminal():
    import io

    from autogemm.cli.campaign import CampaignView

    stream = io.StringIO()
    view = CampaignView(["GPU0", "GPU1"], total=3, stream=stream)
    key = "float16/fp32/nn/b1/4096x4096x4096"
    view.event(("ready", "GPU0", "NVIDIA H100 80GB HBM3", "host:1:x"))
    view.event(("start", "GPU0", key))
    view.event(("trial", "GPU0", key, 5, 700.0, 1.02))
    view.event(("done", "GPU0", key, {"config": "hopper_x", "tflops": 700.0, "ratio": 1.02, "kept_cublas": False}))
    view.event(("failed", "GPU1", "float64/fp64/nn/b1/1x1x1", "nothing measurable"))
    view.tick()
    view.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4  # trials are not logged line by line
    assert lines[0].endswith("GPU0: NVIDIA H100 80GB HBM3 ready")
    assert f"GPU0: done {key}: hopper_x 700.0 TFLOP/s, 1.020x cuBLAS" in lines[2]
    assert "GPU1: failed float64/fp64/nn/b1/1x1x1: nothing measurable" in lines[3]
    assert view.failed == ["float64/fp64/nn/b1/1x1x1"]


def test_the_readme_campaign_example_is_a_valid_campaign():
    import re
    import tomllib

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme[readme.index("### Campaigns"):]
    example = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    campaign = parse_campaign(tomllib.loads(example))
    assert campaign.name == "llm" and len(campaign.problems) == 4 * 2 * 2
    assert campaign.storage.startswith("postgresql+psycopg2://")
    shipped = load_campaign(Path(__file__).parent.parent / "campaigns" / "shipped.toml")
    assert len(shipped.problems) == 152


def test_a_campaign_tunes_problems_with_epilogues_given_by_key():
    from autogemm.epilogue import Epilogue

    campaign = parse_campaign({"campaign": {"name": "x"}, "problems": [
        {"M": [16, 128], "N": 14336, "K": 4096, "dtype": "bfloat16", "layout": "nt",
         "epilogue": ["", "bias_n+gelu", "bias_n+silu+res"]}]})
    keys = [p.key for p in campaign.problems]
    assert len(keys) == 6 and "bfloat16/fp32/nt/b1/16x14336x4096" in keys
    assert "bfloat16/fp32/nt/b1/128x14336x4096/bias_n+silu+res" in keys
    assert {p.epilogue for p in campaign.problems} == {Epilogue(), Epilogue("n", "gelu"), Epilogue("n", "silu", True)}
    for bad, said in (("bias_n+gelu>float32", "not another output dtype or a gate"),
                      ("gelu+bogus", re.escape("problems[0].epilogue 'gelu+bogus': not an epilogue key"))):
        with pytest.raises(CampaignFileError, match=said):
            parse_campaign({"campaign": {"name": "x"}, "problems": [{"M": 8, "epilogue": bad}]})


# ---- what workers share with the tuner and the parent ---------------------------------------------
def test_a_campaign_tunes_each_problem_with_its_files_options_and_the_workers_own(monkeypatch):
    """The file's timeout, trials, seed and patience make the campaign's TuneOptions (the rest the
    tuner's defaults, 20 s where the file gives no timeout); a worker adds its storage, compile
    jobs and space, and reports each trial as an event."""
    import autogemm.tuning.tuner as tuner
    from autogemm.campaigns.events import WorkerEvent
    from autogemm.campaigns.worker import _campaign_tune
    from autogemm.tuning.options import TuneOptions

    assert parse_campaign({"campaign": {"name": "x"}, "problems": [{"M": 8}]}).tune_options == TuneOptions(timeout=20.0)
    campaign = parse_campaign({"campaign": {"name": "x", "timeout": 5, "trials": 30, "seed": 7, "patience": 0},
                               "problems": [{"M": 8}]})
    assert campaign.tune_options == TuneOptions(timeout=5.0, trials=30, seed=7, patience=0)
    asked = []

    def fake_tune(problem, options, **given):
        asked.append((options, given))
        given["progress"](3, 100.0, 1.1)

    monkeypatch.setattr(tuner, "tune", fake_tune)
    events = []

    class Queue:
        put = events.append

    spec = WorkerSpec(campaign, "sqlite:///claims.db", "W0", None, 4)
    _campaign_tune(spec, campaign.problems[0], "cache", Queue(), "sharing", space="simt", study_name="s")
    [(options, given)] = asked
    assert options == TuneOptions(timeout=5.0, trials=30, seed=7, patience=0, storage="sqlite:///claims.db", jobs=4,
                                  space="simt", study_name="s")
    assert (given["cache"], given["sharing"], given["evaluator"]) == ("cache", "sharing", None)
    assert events == [(WorkerEvent.TRIAL, "W0", campaign.problems[0].key, 3, 100.0, 1.1)]


def test_worker_events_are_the_strings_they_have_always_been():
    """A WorkerEvent is its string: the view reads an event of members as one of plain strings (an
    older worker's), after the queue's pickling too, and prints it the same."""
    import io
    import pickle

    from autogemm.campaigns.events import WorkerEvent
    from autogemm.cli.campaign import CampaignView

    assert {event.value for event in WorkerEvent} == {"ready", "start", "trial", "done", "helping", "failed",
                                                      "skipped", "stopped", "lost", "error"}
    shown = []
    for kind in (WorkerEvent.FAILED, "failed"):
        stream = io.StringIO()
        CampaignView(["GPU0"], total=1, stream=stream).event(pickle.loads(pickle.dumps((kind, "GPU0", "p", "why"))))
        shown.append(stream.getvalue().split(" ", 1)[1])  # (after the time of day)
    assert shown == ["GPU0: failed p: why\n"] * 2


def test_claim_states_are_the_strings_the_board_has_always_stored(tmp_path):
    """Rows an older version wrote ("open", "claimed", "done") read as the ClaimState of that name,
    and this version writes the plain strings, which older versions read."""
    import sqlalchemy as sa

    from autogemm.campaigns.claims import claims_table

    assert [state.value for state in ClaimState] == ["open", "claimed", "done"]
    board = ClaimBoard(f"sqlite:///{tmp_path / 'claims.db'}")
    board.register("c", "gpu", ["p0", "p1", "p2"])
    rows = claims_table.c.problem
    with board.engine.begin() as db:  # as an older version left them: p0 done, p1 held by a silent worker
        db.execute(claims_table.update().where(rows == "p0").values(state="done", result='{"ratio": 1.5}'))
        db.execute(claims_table.update().where(rows == "p1").values(state="claimed", owner="old", heartbeat=0.0))
    assert [c.state for c in board.claims("c")] == [ClaimState.DONE, ClaimState.CLAIMED, ClaimState.OPEN]
    owner = new_owner()
    assert board.claim("c", "gpu", owner, grace=60) == "p1"  # taken over: its heartbeat is late
    assert board.finish("c", "gpu", "p1", owner, {"ratio": 1.2})
    with board.engine.begin() as db:
        stored = dict(db.execute(sa.select(rows, claims_table.c.state)).all())
    assert stored == {"p0": "done", "p1": "done", "p2": "open"} and {type(s) for s in stored.values()} == {str}
    board.close()


def test_several_workers_on_one_sqlite_file_are_told_of_the_journal():
    from autogemm.campaigns.campaign import storage_advice

    advice = storage_advice("sqlite:////tmp/studies.db", 2)
    assert advice and "journal:///" in advice and "PostgreSQL" in advice
    assert storage_advice("sqlite:////tmp/studies.db", 1) is None
    assert storage_advice("journal:////tmp/studies.log", 8) is None
    assert storage_advice("postgresql+psycopg2://tuner@db/autogemm", 8) is None


def test_a_campaign_without_a_storage_gets_a_journal_of_its_own_and_a_reader_makes_nothing(tmp_path, monkeypatch):
    from autogemm.campaigns.campaign import resolve_storage

    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    campaign = parse_campaign({"campaign": {"name": "llm-proj.v2"}, "problems": [{"shapes": [[64, 64, 64]]}]})
    assert resolve_storage(campaign, create=False) == f"journal:///{tmp_path / 'user' / 'campaigns' / 'llm-proj.v2.log'}"
    assert not (tmp_path / "user").exists()
    assert resolve_storage(campaign) == resolve_storage(campaign, create=False)
    assert (tmp_path / "user" / "campaigns").is_dir() and not (tmp_path / "user" / "campaigns" / "llm-proj.v2.log").exists()
    named = parse_campaign({"campaign": {"name": "c", "storage": "sqlite:////tmp/s.db"}, "problems": [{"shapes": [[8, 8, 8]]}]})
    assert resolve_storage(named) == "sqlite:////tmp/s.db"
