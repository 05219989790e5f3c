"""Secrets: a storage URL's password never reaches what autogemm prints, writes or keeps (tables,
JSON, error texts, progress lines, the claim board, the report page, cache files), whether the URL
parses or not; and the file lock dependency is one whose lock files do not follow symlinks."""

from __future__ import annotations

import io
import json
import re
import tomllib
import uuid
from pathlib import Path

import pytest

from autogemm.results.cache import TuningCache
from autogemm.cli import main
from autogemm.measure.recorded import RecordedEvaluator, RecordedTable
from autogemm.tuning.study import shown_url
from autogemm.tuning.tuner import TuneError, tune

from campaign_helpers import SPACE_PATH, ReplayFactory
from test_campaign import postgres_server  # noqa: F401 (a fixture)

HERE = Path(__file__).parent
TABLE = RecordedTable.load(HERE / "data" / "simt_small_4096.jsonl")
PASSWORD = "s3cretPW"


@pytest.mark.parametrize("url, shown", [
    ("postgresql+psycopg2://tuner:s3cretPW@db.example/autogemm", "postgresql+psycopg2://tuner:***@db.example/autogemm"),
    ("postgresql://user:s3cretPW@host:notaport/db", "postgresql://user:***@host:notaport/db"),  # does not parse
    ("postgresql://user:s3cretPW@localhost:1/db", "postgresql://user:***@localhost:1/db"),
    ("postgresql://user:s3c@retPW@host/db", "postgresql://user:***@host/db"),  # an '@' left unescaped
    ("postgresql://user@host/db?password=s3cretPW&sslmode=require", "postgresql://user@host/db?password=***&sslmode=require"),
    ("mysql+pymysql://u:s3cretPW@[::1:bad/x", "mysql+pymysql://u:***@[::1:bad/x"),
    ("redis://:s3cretPW@host:6379/0", "redis://:***@host:6379/0"),
    ("sqlite:////tmp/studies.db", "sqlite:////tmp/studies.db"),
    ("journal:///tmp/a:b/studies.log", "journal:///tmp/a:b/studies.log"),
])
def test_shown_urls_hide_the_password_even_where_the_url_does_not_parse(url, shown):
    assert shown_url(url) == shown


def test_the_file_lock_dependency_refuses_symlinked_lock_files(tmp_path):
    # filelock before 3.20.1 opened a lock file through a symlink planted at its path (and truncated
    # the target: CVE-2025-68146); before 3.20.3 its SoftFileLock did (CVE-2026-22701)
    from filelock import FileLock

    project = tomllib.loads((HERE.parent / "pyproject.toml").read_text())["project"]
    (pin,) = [d for d in project["dependencies"] if re.match(r"filelock\b", d)]
    minimum = tuple(int(x) for x in re.fullmatch(r"filelock>=([\d.]+)", pin.replace(" ", "")).group(1).split("."))
    assert minimum >= (3, 20, 3), pin
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "x.lock").symlink_to(victim)
    with pytest.raises(OSError):
        with FileLock(str(tmp_path / "x.lock"), timeout=1):
            pass
    assert victim.read_text() == "precious"


# ---- every command, with a password in the storage URL -------------------------------------------
def _database(server, password: str) -> str:
    """A fresh database of the test server, its URL carrying `password` (the server trusts local
    connections, so the password is sent nowhere and the storage works)."""
    import sqlalchemy as sa

    base = server.get_uri().replace("postgresql://", "postgresql+psycopg2://", 1)
    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with engine.connect() as db:
        db.execute(sa.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    assert "postgres:@" in base
    return base.replace("/postgres?", f"/{name}?", 1).replace("postgres:@", f"postgres:{password}@", 1)


def _break_study_storage(url: str) -> None:
    """Optuna's tables as another Optuna version left them: every study open fails, the claim
    board (a table of its own) still works."""
    import optuna
    import sqlalchemy as sa

    optuna.create_study(storage=url, study_name="someone-else")
    engine = sa.create_engine(url)
    with engine.begin() as db:
        db.execute(sa.text("UPDATE alembic_version SET version_num = 'v99.0.0.from-the-future'"))
    engine.dispose()


def _tune(tmp_path: Path, storage: str):
    return tune(TABLE.problem, trials=4, timeout=None, space=SPACE_PATH, storage=storage,
                evaluator=RecordedEvaluator(TABLE), cache=TuningCache(tmp_path / "user" / "tuned", shipped=False))


def test_a_storage_password_is_never_shown_nor_stored(tmp_path, capsys, monkeypatch, postgres_server):  # noqa: F811
    import sqlalchemy as sa

    from autogemm.campaigns.file import load_campaign
    from autogemm.campaigns.worker import WorkerSpec, _claim_and_tune
    from autogemm.cli.campaign import CampaignView
    from autogemm.cli.tuning import _format_result

    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    good, broken = _database(postgres_server, PASSWORD), _database(postgres_server, PASSWORD)
    _break_study_storage(broken)
    bad_port = f"postgresql://user:{PASSWORD}@host:notaport/db"
    shown: list[str] = []  # everything the commands printed or returned

    def cli(*argv):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        shown.extend([out, err])
        return code, out, err

    # tune: the library's result (table, JSON) and its errors; the command (no GPU here: it fails early)
    result = _tune(tmp_path, good)
    shown += [json.dumps(result.to_json()), _format_result(result), repr(result)]
    assert "postgres:***@" in result.to_json()["storage"]
    for storage in (broken, bad_port):
        with pytest.raises(TuneError) as info:
            _tune(tmp_path, storage)
        shown.append(str(info.value))
        cli("tune", "--M", "64", "--storage", storage)
        cli("tune", "--M", "64", "--storage", storage, "--json")

    # a campaign whose study storage fails: the worker's events, the progress lines, the board
    campaigns = {}
    for label, storage in (("broken", broken), ("badport", bad_port), ("scheme", f"redis://u:{PASSWORD}@h/0")):
        path = tmp_path / f"{label}.toml"
        path.write_text(f'[campaign]\nname = "c"\nstorage = "{storage}"\ncache_dir = "cache"\n'
                        '[[problems]]\nshapes = [[4096, 4096, 1024], [4096, 4096, 2048]]\n')
        campaigns[label] = path
    campaign = load_campaign(campaigns["broken"])
    events = []

    class Events:
        def put(self, event):
            events.append(event)

    _claim_and_tune(WorkerSpec(campaign, broken, "W0", None, 1, ReplayFactory(), str(SPACE_PATH)), Events())
    shown.append(repr(events))
    stream = io.StringIO()
    view = CampaignView(["W0"], total=2, stream=stream)
    for event in events:
        view.event(event)
    shown.append(stream.getvalue())
    engine = sa.create_engine(broken)
    with engine.connect() as db:
        shown.append(repr(db.execute(sa.text("SELECT * FROM autogemm_claims")).all()))
    engine.dispose()
    for path in campaigns.values():
        cli("campaign", "run", str(path))
        cli("campaign", "status", str(path))
        cli("campaign", "status", str(path), "--json")
        cli("campaign", "export", str(path), "-o", str(tmp_path / "export.json"))

    # the report page, and the report's errors
    page = tmp_path / "report.html"
    if _has_plotly():
        code, _, err = cli("report", "--all", "--storage", good, "-o", str(page))
        assert code == 0, err
        shown.append(page.read_text())
        assert "postgres:***@" in page.read_text()
    for storage in (broken, bad_port):
        cli("report", "--all", "--storage", storage, "-o", str(tmp_path / "other.html"))

    # the cache's commands
    cli("cache", "list")
    cli("cache", "list", "--json")
    cli("cache", "show", TABLE.problem.key)

    leaks = [text for text in shown if PASSWORD in text]
    assert not leaks, leaks[0][:2000]
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".toml" and PASSWORD.encode() in p.read_bytes()]
    assert not written, written


def _has_plotly() -> bool:
    try:
        import plotly  # noqa: F401
    except ImportError:
        return False
    return True
