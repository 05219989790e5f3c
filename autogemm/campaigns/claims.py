"""Who tunes which problem of a campaign: a claim per (campaign, device model, problem), kept in the
same database as the Optuna studies, so that every host pointed at that database shares the work.

A worker takes the first open problem of its device model with a conditional UPDATE (the row
changes only if it is still open, or claimed by a holder whose heartbeat is older than the grace
period): the database decides between workers racing for one row, on PostgreSQL as on SQLite, and
no host needs to reach another. While it tunes, the worker renews its heartbeat; a worker that dies
(a killed process, a lost host) stops renewing it, and after the grace period another worker takes
the problem over and resumes its studies. Claims held by processes of this host that no longer run
are taken over at once: "this host" is the host name, its boot and its PID namespace, since
containers that share a host name do not see each other's processes (where the boot or namespace
cannot be read, only the heartbeat decides). A row in a state this version does not know is left
alone. Times are the database's clock, never a host's, so that hosts whose clocks
disagree still agree on who is late. A holder announces the study it is searching (`announce`), so
that a worker with nothing left to claim can help it (several GPUs on one study, `campaign.py`).

Optuna's journal file storage has no database: its claims live in an SQLite file beside the
journal (one host).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from urllib.parse import quote
from typing import Any

import sqlalchemy as sa

from ..host_identity import identity


class ClaimState(StrEnum):
    """A claim's state, as the board's `state` column holds it: the strings of every version so far,
    so that rows written by an older version read the same (a row in a state this version does not
    know is left alone)."""

    OPEN = "open"  # nobody tunes it: not yet, or given back
    CLAIMED = "claimed"  # a worker tunes it, while its heartbeat is on time
    DONE = "done"  # tuned (or failed for good): the result is on the board


CLAIM_ROUNDS = 100  # see ClaimBoard.claim

_metadata = sa.MetaData()
claims_table = sa.Table(
    "autogemm_claims", _metadata,
    sa.Column("campaign", sa.String(64), primary_key=True),
    sa.Column("device", sa.String(128), primary_key=True),
    sa.Column("problem", sa.String(128), primary_key=True),
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("owner", sa.String(255)),
    sa.Column("heartbeat", sa.Float),  # the database's clock, seconds since the epoch
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("finished", sa.Float),
    sa.Column("result", sa.Text),  # JSON: the tune's summary (or its error)
    sa.Column("study", sa.String(512)),  # the study the holder searches now (helpers join it); None between
)


def claims_url(storage_url: str) -> str:
    """The database of a storage's claims: the storage's own, or an SQLite file beside a journal."""
    if storage_url.startswith("journal:///"):
        return f"sqlite:///{storage_url[len('journal:///'):]}.claims.db"
    return storage_url


HOST_NAME_VARIABLE = "AUTOGEMM_HOST_NAME"
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class HostNameError(ValueError):
    """AUTOGEMM_HOST_NAME is not a name a claim can carry."""


def host_name() -> str:
    """The name this host's workers go by in claims: $AUTOGEMM_HOST_NAME where set (containers that share
    a host name, or two "hosts" of one machine in a test of the multi-host recipe), else the host name.
    Claims of a dead process are taken at once only by a worker of the same name, boot and PID namespace;
    any other waits for the claim's heartbeat to age past the grace period."""
    given = os.environ.get(HOST_NAME_VARIABLE)
    if given is None:
        return socket.gethostname()[:128]
    if not _HOST_NAME.fullmatch(given):
        raise HostNameError(f"{HOST_NAME_VARIABLE}={given[:40]!r}: a host name in claims is 1-128 letters, digits, "
                            f"'.', '_' or '-', starting with a letter or digit")
    return given


def new_owner() -> str:
    """This process's name in claims: host, boot id, PID namespace, process id and a token no other
    process shares."""
    boot, namespace = identity()
    return f"{host_name()}:{boot}:{namespace}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _owner_is_dead_here(owner: str | None) -> bool:
    """Whether `owner` is a process of this host, boot and PID namespace that no longer runs."""
    boot, namespace = identity()
    if not owner or not boot:
        return False
    parts = owner.rsplit(":", 4)
    if len(parts) != 5 or parts[:3] != [host_name(), boot, namespace]:
        return False  # (owners named before boot and namespace were part of the name: heartbeat only)
    try:
        os.kill(int(parts[3]), 0)
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError, OverflowError):
        return False
    return False


@dataclass(frozen=True)
class Claim:
    campaign: str
    device: str
    problem: str
    position: int
    state: str  # as stored: equal to a ClaimState, unless another version wrote a state this one does not know
    owner: str | None
    heartbeat: float | None
    attempts: int
    result: dict[str, Any] | None
    study: str | None = None


class ClaimBoard:
    """The claims of every campaign in one database (created on first use)."""

    def __init__(self, storage_url: str):
        url = claims_url(storage_url)
        given = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
        if given and not given.startswith("file:") and "?" not in given:  # (a plain path: SQLite makes no folders)
            Path(given).parent.mkdir(parents=True, exist_ok=True)
        self.engine = sa.create_engine(url, **_engine_kwargs(url))
        for attempt in range(4):
            try:
                _metadata.create_all(self.engine, checkfirst=True)
                break
            except sa.exc.DBAPIError:  # another worker or host created the table meanwhile
                if attempt == 3:
                    raise
                time.sleep(0.5 * (attempt + 1))
        self._add_study_column()
        dialect = self.engine.dialect.name
        if dialect == "sqlite":
            self._now = sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)")
        elif dialect == "postgresql":
            self._now = sa.literal_column("extract(epoch from clock_timestamp())")
        elif dialect == "mysql":
            self._now = sa.literal_column("UNIX_TIMESTAMP(NOW(6))")
        else:
            raise ValueError(f"campaign claims need SQLite, PostgreSQL or MySQL, not {dialect}")

    def _add_study_column(self) -> None:
        """Boards created before claims named their study lack the column: add it (once, whoever
        races to it)."""
        for attempt in range(4):
            columns = {c["name"] for c in sa.inspect(self.engine).get_columns(claims_table.name)}
            if "study" in columns:
                return
            try:
                with self.engine.begin() as db:
                    db.execute(sa.text(f"ALTER TABLE {claims_table.name} ADD COLUMN study VARCHAR(512)"))
                return
            except sa.exc.DBAPIError:  # another worker added it meanwhile: look again
                if attempt == 3:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def close(self) -> None:
        self.engine.dispose()

    def _key(self, campaign: str, device: str, problem: str):
        t = claims_table.c
        return sa.and_(t.campaign == campaign, t.device == device, t.problem == problem)

    def register(self, campaign: str, device: str, problems: list[str]) -> int:
        """Adds the problems not yet on the board (open); returns how many were added. Racing
        registrations of the same campaign add each problem once."""
        t = claims_table.c
        for _ in range(5):
            with self.engine.begin() as db:
                present = set(db.scalars(sa.select(t.problem).where(t.campaign == campaign, t.device == device)))
                missing = [(i, p) for i, p in enumerate(problems) if p not in present]
                if not missing:
                    return 0
                try:
                    db.execute(claims_table.insert(), [
                        {"campaign": campaign, "device": device, "problem": p, "position": i,
                         "state": ClaimState.OPEN, "attempts": 0} for i, p in missing])
                    return len(missing)
                except sa.exc.IntegrityError:  # another worker registered some meanwhile: look again
                    continue
        raise RuntimeError(f"could not register the problems of campaign {campaign}")

    def claim(self, campaign: str, device: str, owner: str, grace: float,
              only: set[str] | None = None) -> str | None:
        """Takes the first open problem (or one whose holder's heartbeat is older than `grace`
        seconds, or whose holder was a process of this host that has ended) for `owner`; its key,
        or None when every problem is done or held by a live worker. `only` limits the choice."""
        t = claims_table.c
        takeable = sa.or_(t.state == ClaimState.OPEN,
                          sa.and_(t.state == ClaimState.CLAIMED, t.heartbeat < self._now - grace))
        # every round that finds candidates takes one, unless other workers took them all meanwhile:
        # a bounded number of rounds (a row no update can take must not spin this loop forever)
        for _ in range(CLAIM_ROUNDS):
            with self.engine.begin() as db:
                rows = db.execute(sa.select(t.problem, t.state, t.owner, t.heartbeat < self._now - grace)
                                  .where(t.campaign == campaign, t.device == device,
                                         t.state.in_((ClaimState.OPEN, ClaimState.CLAIMED)))
                                  .order_by(t.position)).all()
            # (problem, its holder where that is a process of this host that has ended)
            candidates = []
            for problem, state, holder, late in rows:
                held = state == ClaimState.CLAIMED
                dead_holder = holder if held and _owner_is_dead_here(holder) else None
                if (only is None or problem in only) and (state == ClaimState.OPEN or (held and (late or dead_holder))):
                    candidates.append((problem, dead_holder))
            if not candidates:
                return None
            for problem, dead_holder in candidates:
                condition = sa.or_(takeable, t.owner == dead_holder) if dead_holder else takeable
                with self.engine.begin() as db:
                    taken = db.execute(claims_table.update()
                                       .where(self._key(campaign, device, problem), t.state != ClaimState.DONE,
                                              condition)
                                       .values(state=ClaimState.CLAIMED, owner=owner, heartbeat=self._now, study=None,
                                               attempts=t.attempts + 1)).rowcount
                if taken == 1:
                    return problem
            # every candidate went to another worker meanwhile: look again
        return None

    def _update_held(self, campaign: str, device: str, problem: str, owner: str, values: dict[str, Any]) -> bool:
        """Changes a claim that `owner` still holds; False if it no longer does (taken over)."""
        t = claims_table.c
        with self.engine.begin() as db:
            return db.execute(claims_table.update()
                              .where(self._key(campaign, device, problem), t.owner == owner,
                                     t.state == ClaimState.CLAIMED)
                              .values(values)).rowcount == 1

    def heartbeat(self, campaign: str, device: str, problem: str, owner: str) -> bool:
        """Renews a claim; False if it is no longer this owner's (taken over after the grace period)."""
        return self._update_held(campaign, device, problem, owner, {"heartbeat": self._now})

    def announce(self, campaign: str, device: str, problem: str, owner: str, study: str | None) -> bool:
        """Says which study the holder searches now (None: none, e.g. while it re-times its finalists),
        for workers that may help it; False if the claim is no longer this owner's."""
        return self._update_held(campaign, device, problem, owner, {"study": study})

    def finish(self, campaign: str, device: str, problem: str, owner: str, result: dict[str, Any]) -> bool:
        """Marks a claimed problem done with its result; False if the claim was no longer this owner's."""
        return self._update_held(campaign, device, problem, owner,
                                 {"state": ClaimState.DONE, "finished": self._now, "result": json.dumps(result),
                                  "study": None})

    def release(self, campaign: str, device: str, problem: str, owner: str) -> bool:
        """Gives a claim back (the tune stopped before it ended): the next worker resumes it at once."""
        return self._update_held(campaign, device, problem, owner,
                                 {"state": ClaimState.OPEN, "owner": None, "heartbeat": None, "study": None})

    def helpable(self, campaign: str, device: str, grace: float, not_owner: str) -> list[Claim]:
        """Problems another live holder is searching now (a study announced, a heartbeat within the
        grace period), first the ones claimed longest ago."""
        t = claims_table.c
        with self.engine.begin() as db:
            rows = db.execute(sa.select(claims_table).where(
                t.campaign == campaign, t.device == device, t.state == ClaimState.CLAIMED, t.study.is_not(None),
                t.owner != not_owner, t.heartbeat >= self._now - grace).order_by(t.position)).mappings().all()
        return [_claim_of(r) for r in rows]

    def claims(self, campaign: str, device: str | None = None) -> list[Claim]:
        t = claims_table.c
        query = sa.select(claims_table).where(t.campaign == campaign)
        if device is not None:
            query = query.where(t.device == device)
        with self.engine.begin() as db:
            rows = db.execute(query.order_by(t.device, t.position)).mappings().all()
        return [_claim_of(r) for r in rows]


def _engine_kwargs(url: str) -> dict[str, Any]:
    return {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {"pool_pre_ping": True}


def _claim_of(row) -> Claim:
    return Claim(campaign=row["campaign"], device=row["device"], problem=row["problem"], position=row["position"],
                 state=row["state"], owner=row["owner"], heartbeat=row["heartbeat"], attempts=row["attempts"],
                 result=_result_of(row["result"]), study=row.get("study"))


def _result_of(text) -> dict[str, Any] | None:
    """A claim's stored result: a JSON object, or None; anything else (a row another version or a
    hand wrote) as an error that says what it is, never a crash of whoever reads the board."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return {"error": "the stored result is not JSON"}
    return value if isinstance(value, dict) else {"error": f"the stored result is not a JSON object: {str(value)[:100]}"}


class BoardReader:
    """The claims as they stand, for commands that only read (status, export): nothing is created
    or altered (an SQLite file is opened read-only), and a storage without a board yet (no
    database file, no table) has no claims. Reads like ClaimBoard.claims."""

    def __init__(self, storage_url: str):
        url = claims_url(storage_url)
        self.engine = None
        if url.startswith("sqlite:///"):
            path = Path(url[len("sqlite:///"):])
            if not path.is_file():
                return
            url = f"sqlite:///file:{quote(str(path))}?mode=ro&uri=true"
        self.engine = sa.create_engine(url, **_engine_kwargs(url))

    def claims(self, campaign: str, device: str | None = None) -> list[Claim]:
        if self.engine is None:
            return []
        inspector = sa.inspect(self.engine)
        if not inspector.has_table(claims_table.name):
            return []
        present = {c["name"] for c in inspector.get_columns(claims_table.name)}  # (older boards lack `study`)
        t = claims_table.c
        query = sa.select(*[c for c in claims_table.c if c.name in present]).where(t.campaign == campaign)
        if device is not None:
            query = query.where(t.device == device)
        with self.engine.connect() as db:
            rows = db.execute(query.order_by(t.device, t.position)).mappings().all()
        return [_claim_of(r) for r in rows]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()
