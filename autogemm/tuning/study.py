"""The Optuna side of a tune: where studies are stored and what they are called, the samplers, one
tuner per study at a time on a machine, and the background writer that copies finished trials
into the persistent study (so that the storage's latency never holds up the search).

A tune's default storage is one SQLite file in the cache directory (a campaign's, a journal file of its
own: `default_campaign_storage`). Optuna creates its tables on first
use, which races between processes that start at once: the storage is opened under a file lock,
and writers wait for each other (a busy timeout) instead of failing with "database is locked". A
default file that is not a database is moved aside with a warning and started afresh.
"""

from __future__ import annotations

import logging
import contextlib
import datetime
import hashlib
import os
import queue
import sqlite3
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from filelock import FileLock

from ..measure.evaluate import Measurement
from ..paths import user_cache_dir
from ..problem import Device, Problem
from ..kernels.render import template_hash
from ..kernels.space import SearchSpace
from ..results.url_secrets import hide_passwords, shown_url
from .journal import JOURNAL, JournalError, journal_storage
from .options import SAMPLERS

log: logging.Logger = logging.getLogger(__name__)
SQLITE_BUSY_TIMEOUT_S = 120  # how long a write waits for another process's
SERVER_ATTEMPTS = 4  # tries at opening a study in a database server (see open_study)


_quiet_lock = threading.Lock()
_quiet: list[int] = []  # the verbosity before the first of the searches running now (one entry, or none)
_quiet_count = 0


@contextlib.contextmanager
def optuna_quiet():
    """Optuna's INFO lines (one per trial told, one per study made) silenced while autogemm searches
    its own studies, and the caller's verbosity back after: Optuna's verbosity is process-wide, and
    setting it for good would silence the caller's own studies. Searches in several threads at once
    restore it when the last one ends."""
    global _quiet_count
    with _quiet_lock:
        if _quiet_count == 0:
            before = optuna.logging.get_verbosity()
            _quiet[:] = [before]
            optuna.logging.set_verbosity(max(before, optuna.logging.WARNING))
        _quiet_count += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_count -= 1
            if _quiet_count == 0:
                optuna.logging.set_verbosity(_quiet.pop())


class StudyLocked(RuntimeError):
    """Another tuner is running the same study on this machine."""

    def __init__(self, message: str, study: str = ""):
        super().__init__(message)
        self.study = study


class StudyStorageError(RuntimeError):
    """The study storage cannot be opened or used."""


def default_campaign_storage(name: str, create: bool = True) -> str:
    """A campaign's storage where its file names none: a journal file of its own in the cache
    directory (campaigns/<name>.log; the name is a campaign name, letters, digits and ._-, checked
    with the file). Not the tunes' SQLite file: several workers writing one SQLite file wait for each
    other (docs/campaigns.md), and a journal per campaign stays as small as the campaign."""
    path = user_cache_dir() / "campaigns" / f"{name}.log"
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    return f"{JOURNAL}{path}"


def default_storage(create: bool = True) -> str:
    """The default storage's URL: SQLite in the cache directory (made, unless `create` is false:
    a reader creates nothing)."""
    path = user_cache_dir() / "studies.db"
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def storage_object(url: str) -> Any:
    """What Optuna takes for a storage URL: the URL itself (RDB storages), or for journal:///PATH a
    journal file storage (one file, appended to under a lock; one host, no database server), made
    once per file and process and appended to only where the file is a journal (journal.py)."""
    if url.startswith(JOURNAL):
        try:
            return journal_storage(url)
        except JournalError as exc:
            raise StudyStorageError(f"the journal storage {shown_url(url)} cannot be used: {exc}") from None
    return url


def sqlite_path(url: str) -> Path | None:
    """The file of an SQLite storage URL; None for any other storage (or an in-memory one)."""
    return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") and url != "sqlite:///:memory:" else None


def _is_database(path: Path) -> bool:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
            return connection.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    except sqlite3.DatabaseError:
        return False


METRIC = "TFLOP/s"  # what a study's values are, as optuna-dashboard shows them


def open_study(name: str, storage: str | None) -> optuna.Study:
    """The persistent study `name` (created if new) in `storage`: any Optuna storage URL, None for
    the default SQLite file. SQLite storages are opened under a file lock, with a busy timeout.
    Its values are named (METRIC), for optuna-dashboard and the report."""
    study = _open_study(name, storage)
    if study.metric_names != [METRIC]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([METRIC])
    return study


def _open_study(name: str, storage: str | None) -> optuna.Study:
    url = storage or default_storage()
    path = sqlite_path(url)
    for attempt in range(SERVER_ATTEMPTS):
        try:
            if path is None:
                return optuna.create_study(study_name=name, storage=storage_object(url), direction="maximize",
                                           load_if_exists=True)
            with FileLock(f"{path}.lock", timeout=SQLITE_BUSY_TIMEOUT_S):
                rdb = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}})
                return optuna.create_study(study_name=name, storage=rdb, direction="maximize", load_if_exists=True)
        except Exception as exc:  # SQLAlchemy's errors, whatever the database
            if storage is None and attempt == 0 and path is not None and path.exists() and not _is_database(path):
                aside = path.with_name(f"{path.name}.corrupt-{datetime.datetime.now():%Y%m%d-%H%M%S-%f}")
                with FileLock(f"{path}.lock", timeout=SQLITE_BUSY_TIMEOUT_S):
                    if path.exists() and not _is_database(path):
                        os.replace(path, aside)
                log.warning("autogemm: the study storage %s is not a database; moved it to %s and started afresh",
                            path, aside)
                continue
            if path is None and attempt + 1 < SERVER_ATTEMPTS and _passing(exc):
                # several hosts or workers creating Optuna's tables in an empty database at once
                # collide (one CREATE wins, the others fail): the tables are there on the next try
                time.sleep(0.5 * (attempt + 1))
                continue
            # (the text reaches tables, progress lines and the claim board: no password in it)
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            raise StudyStorageError(hide_passwords(f"the study storage {shown_url(url)} cannot be used: "
                                                   f"{type(exc).__name__}: {first}", url)) from None
    raise AssertionError("unreachable")


def _passing(exc: Exception) -> bool:
    """Whether a failure to open a study may pass on its own (the database's errors: a collision,
    a dropped connection), unlike a URL that cannot be parsed or a schema of another version."""
    import sqlalchemy.exc  # (lazy: SQLAlchemy)

    return isinstance(exc, sqlalchemy.exc.DBAPIError)


def study_name_for(problem: Problem, device: Device, space: SearchSpace) -> str:
    # The template hash is part of the name: timings of other template versions do not carry over.
    return f"{device.slug}:{problem.key}:{space.name}:{template_hash()}"


def make_sampler(kind: str, seed: int | None, space: SearchSpace) -> optuna.samplers.BaseSampler:
    if kind == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # multivariate: tile knobs interact; constant_liar: candidates compiling ahead of
            # their results are not proposed again
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=12, multivariate=True, constant_liar=True)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        return GridSampler({k: list(v) for k, v in space.knobs.items()}, seed=seed)
    raise ValueError(f"unknown sampler {kind!r}; choose from {', '.join(SAMPLERS)}")


class GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler stops its study once the grid is exhausted, which only works inside
    study.optimize(); this loop uses ask and tell and ends on its own when proposals repeat."""

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        pass


def ask_params(trial: optuna.Trial, space: SearchSpace, choices: dict[str, tuple[Any, ...]] | None = None) -> dict[str, Any]:
    """Draws every knob of the space through Optuna's trial, from `choices` where given (the
    space's `knob_choices` for the study's problem: the same in every trial of a study)."""
    return {knob: trial.suggest_categorical(knob, list(values)) for knob, values in (choices or space.knobs).items()}


def best_configs(study: optuna.Study, space: SearchSpace, limit: int) -> list[Any]:
    """The best distinct configurations measured in the study (earlier runs included). A trial
    whose config this version cannot read (a study another version wrote) is skipped with a
    warning: it must not cost the whole search its result."""
    seen: dict[str, float] = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        name = t.user_attrs.get("config")
        if isinstance(name, str) and name and t.value is not None and t.value > seen.get(name, 0.0):
            seen[name] = t.value
    configs = []
    for name in sorted(seen, key=seen.get, reverse=True):
        try:
            configs.append(space.config_class.from_name(name))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            warnings.warn(f"study {study.study_name}: skipped the trials of config {str(name)[:200]!r}, which this "
                          f"version cannot read ({str(exc)[:200]})", stacklevel=2)
            continue
        if len(configs) == limit:
            break
    return configs


def lock_study(name: str, wait: float = 0.0) -> Any:
    """One tuner per study at a time on this machine: a second one is refused (after waiting up
    to `wait` seconds for the first to finish), with the reason."""
    from filelock import FileLock, Timeout  # (lazy: only this lock needs it)

    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    path = user_cache_dir() / "locks" / f"tune-{digest}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=wait)
    except Timeout:
        raise StudyLocked(f"another autogemm tune is already running study {name} on this machine "
                          f"(lock {path}); wait for it to finish, or give a different --study-name", name) from None
    return lock


def wait_for_study(name: str, timeout: float) -> bool:
    """Waits until no tune runs study `name` on this machine (at most `timeout` seconds); True if
    none does any more."""
    try:
        lock_study(name, wait=timeout).release()
    except StudyLocked:
        return False
    return True


def tell_trials(study: optuna.Study, writer: StudyWriter, asked: list[Any], measurement: Measurement) -> None:
    for index, trial in enumerate(asked):
        if index:
            trial.set_user_attr("duplicate", True)
        if measurement.ok:
            trial.set_user_attr("time_ms", measurement.time_ms)
            if measurement.rel_error is not None:
                trial.set_user_attr("rel_error", measurement.rel_error)
            writer.put(study.tell(trial, measurement.tflops))
        else:
            trial.set_user_attr("failure", measurement.kind)
            trial.set_user_attr("message", measurement.message[:1000])
            writer.put(study.tell(trial, state=optuna.trial.TrialState.FAIL))


def remember_trials(trials: Any, known: dict[str, float], failed_before: dict[str, Measurement]) -> int:
    """Adds finished trials to what a search knows: measured configs' TFLOP/s (repeated proposals
    answered from the study add nothing) and failed configs' failures (a cancelled one may still
    be measured). Returns how many configs were measured that `known` did not hold."""
    new = 0
    for t in trials:
        config = t.user_attrs.get("config")
        if not config:
            continue
        if t.state == optuna.trial.TrialState.COMPLETE and not t.user_attrs.get("duplicate"):
            new += config not in known
            known[config] = max(known.get(config, 0.0), t.value)
        elif t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get("failure") not in (None, "cancelled"):
            failure = Measurement.failure(t.user_attrs["failure"], t.user_attrs.get("message", ""))
            failed_before.setdefault(config, failure)
    return new


class StudyWriter:
    """Copies finished trials into the persistent study from a background thread, so that the
    storage's latency (milliseconds per write for SQLite) never holds up the search. Repeated
    proposals (answered from the study, marked "duplicate") stay out of it: the persistent study
    holds each measurement once, as optuna-dashboard and a resumed search should count it."""

    def __init__(self, persistent: optuna.Study | None):
        self.persistent = persistent
        self.queue: queue.Queue = queue.Queue()
        self.error: Exception | None = None
        self.thread = None
        if persistent is not None:
            self.thread = threading.Thread(target=self._run, name="autogemm-study-writer", daemon=True)
            self.thread.start()

    def put(self, trial: optuna.trial.FrozenTrial) -> None:
        if self.thread is not None and not trial.user_attrs.get("duplicate"):
            self.queue.put(trial)

    def _run(self) -> None:
        while (trial := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.persistent.add_trial(trial)
                except Exception as exc:  # a storage failure must not end the tune: report it
                    self.error = exc
                    log.warning("autogemm: could not write to the study storage (%s); the search goes on, this "
                                "run's trials will not be resumable", exc)

    def close(self) -> None:
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
            self.thread = None


# How often a shared tune reads the trials other workers finished into its own search (seconds).
EXCHANGE_EVERY_S = 1.0
_FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


@dataclass
class Sharing:
    """A campaign's tune of a study that other GPUs may search at the same time. The holder of the
    problem announces each study it starts (and None when its search ends, before it re-times its
    finalists); a helper searches the holder's study while `keep_helping()` says so, and leaves the
    decision (re-timing, caching) to the holder."""

    announce: Callable[[str | None], None] | None = None  # the holder's
    keep_helping: Callable[[], bool] | None = None  # a helper's

    @property
    def helper(self) -> bool:
        return self.keep_helping is not None


class TrialExchange:
    """Several workers (GPUs, hosts) searching one persistent study, each with its in-memory study
    and sampler: every trial is tagged with its worker, and `pull` adds to the in-memory study the
    trials the other workers finished since the last pull, so that each sampler models every
    measurement and no worker measures a configuration another one has already measured (TPE's
    constant liar still keeps each worker off its own candidates in flight)."""

    def __init__(self, persistent: optuna.Study, study: optuna.Study, loaded: list[Any], every: float = EXCHANGE_EVERY_S):
        self.persistent, self.study, self.every = persistent, study, every
        self.worker = uuid.uuid4().hex[:12]
        self.seen = {t.number for t in loaded}  # the persistent trials the in-memory study began with
        self.pulled = 0  # trials of other workers taken in
        self.last = time.monotonic()

    def tag(self, trial: optuna.Trial) -> None:
        trial.set_user_attr("worker", self.worker)

    def due(self) -> bool:
        """Whether `every` seconds have passed since the last pull."""
        return time.monotonic() - self.last >= self.every

    def pull(self) -> list[optuna.trial.FrozenTrial]:
        """The other workers' trials finished since the last pull, added to the in-memory study."""
        self.last = time.monotonic()
        fresh = [t for t in self.persistent.get_trials(deepcopy=False, states=_FINISHED) if t.number not in self.seen]
        self.seen.update(t.number for t in fresh)
        theirs = [t for t in fresh if t.user_attrs.get("worker") != self.worker]
        self.study.add_trials(theirs)
        self.pulled += len(theirs)
        return theirs
