"""What `autogemm report` shows, gathered from where autogemm keeps it: the studies of an Optuna
storage (each trial's TFLOP/s, failures, rejections) and the tuned-results cache (the winners and
cuBLAS's figure of the same run), with what `reports.measured` reads of the benchmark results. The
page itself is built by `reports.charts`; this module reads, checks and reduces.

Everything read here comes from files or databases someone else wrote: a storage that is missing
or is not Optuna's is refused without being created or altered, studies whose names are not
autogemm's are listed as skipped, and the page escapes every string it takes from here.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote
from typing import Any

import optuna

from ..results.cache import DEVICE_SLUG, TuningCache
from ..problem import Problem
from .measured import Ceiling, SweepPoint, found_results, measured_bandwidth, measured_ceilings, name_matches, read_results, shape_sweep
from ..tuning.study import JOURNAL, default_storage, optuna_quiet, shown_url, sqlite_path, storage_object
from ..results.url_secrets import hide_passwords

# Where Optuna keeps its schema's version: rows it writes when they are missing (see _rdb_storage).
VERSION_TABLES = {"version_info", "alembic_version"}

# Fewer measured trials than this say nothing about which knob matters.
MIN_TRIALS_FOR_IMPORTANCE = 8


class ReportInputError(ValueError):
    """A storage, study or file named for the report does not exist or cannot be read."""


class NothingToReport(RuntimeError):
    """The storage holds no study the report could show."""


@dataclass
class StudyHistory:
    """One study (one search space's search of a problem) as the page shows it."""

    name: str
    space: str
    trials: list[tuple[int, float]]  # (trial number, TFLOP/s) of each measured, non-repeated trial
    failures: dict[str, int]  # kind -> distinct candidates ("rejected": refused before compiling)
    importances: dict[str, float] = field(default_factory=dict)
    importance_note: str = ""  # why there are none, where there are none

    @property
    def running_best(self) -> list[float]:
        best, out = 0.0, []
        for _, value in self.trials:
            best = max(best, value)
            out.append(best)
        return out


@dataclass
class Winner:
    """The figures of a problem's best result, from its cache record or else its studies."""

    source: str  # "user cache", "shipped cache" or "study best trial"
    config_name: str
    knobs: dict[str, Any]
    tflops: float  # the best generated kernel's
    cublas_tflops: float | None = None
    ratio: float | None = None
    rel_error: float | None = None
    serves: str = ""  # what matmul serves, in words
    served_by_matmul: bool = False  # the generated kernel of a current cache record
    date: str = ""
    # the record's own timing figures, as `tune`'s table and `explain` give them: (label, text) rows
    timing: list[Any] = field(default_factory=list)


@dataclass
class ProblemReport:
    device: str  # slug
    problem: Problem
    studies: list[StudyHistory]
    winner: Winner | None


@dataclass
class DeviceReport:
    slug: str
    name: str
    problems: list[ProblemReport]
    compute_ceilings: dict[str, Ceiling]  # by dtype/compute
    bandwidth: Ceiling | None
    sweep: list[SweepPoint]
    sweep_source: str


@dataclass
class Report:
    storage: str  # where the studies were read, as the page says it: the URL given (password hidden)
    devices: list[DeviceReport]
    skipped: list[str]  # studies whose names are not autogemm's


def storage_named(given: str | None) -> str:
    """The storage as messages and the page name it: the URL the user gave, its password hidden
    (never the absolute path of the default file, which names the user's home)."""
    return f"the study storage {shown_url(given)}" if given else "the default study storage"


def open_storage(url: str | None) -> tuple[Any, list[str]]:
    """The storage behind `url` (None: the default SQLite file), only read: a file that is missing
    or is not Optuna's, or a database without Optuna's tables, is refused instead of created or
    altered."""
    given, url = url, url or default_storage(create=False)
    named = storage_named(given)
    path = sqlite_path(url)
    if url.startswith(JOURNAL):
        path = Path(url[len(JOURNAL):])
    if path is not None and not path.is_file():
        if given is None:  # nothing tuned here yet: not a mistake in the command line
            raise NothingToReport(f"no studies yet: {named} does not exist; tune a problem first, or name a storage "
                                  "with --storage")
        raise ReportInputError(f"{named} does not exist (no file {path})")
    try:
        if url.startswith(JOURNAL):
            storage = storage_object(url)
        else:
            storage = _rdb_storage(url, named)
        return storage, optuna.study.get_all_study_names(storage=storage)
    except ReportInputError:
        raise
    except Exception as exc:  # SQLAlchemy's and Optuna's errors, whatever the database
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        raise ReportInputError(hide_passwords(f"{named} cannot be read: {type(exc).__name__}: {first}", url)) from None


def _rdb_storage(url: str, named: str):
    """Optuna's storage in the database of `url`, opened only where Optuna's tables and version rows
    are all there: Optuna would otherwise create or complete them, and a report only reads (an
    SQLite file is opened read-only besides)."""
    import sqlalchemy as sa  # (lazy: SQLAlchemy)

    path = sqlite_path(url)
    if path is not None:
        url = f"sqlite:///file:{quote(str(path))}?mode=ro&uri=true"
    engine = sa.create_engine(url)
    try:
        tables = set(sa.inspect(engine).get_table_names())
        versions = VERSION_TABLES & tables
        with engine.connect() as db:
            empty = [t for t in sorted(versions) if db.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar() == 0]
    finally:
        engine.dispose()
    if "studies" not in tables:
        raise ReportInputError(f"{named} holds no Optuna studies")
    if versions != VERSION_TABLES or empty:
        raise ReportInputError(f"{named} is not a complete Optuna storage (no version in "
                               f"{', '.join(sorted(VERSION_TABLES - versions) + empty)}); it is left as it is")
    # one engine for every study read, not one per study
    return optuna.storages.RDBStorage(url, skip_table_creation=True)


def parse_study_name(name: str) -> tuple[str, Problem, str] | None:
    """(device slug, problem, space) of a study named as autogemm names them
    (`device:problem:space:template hash`), None for any other name."""
    parts = name.split(":")
    if len(parts) < 4 or not DEVICE_SLUG.fullmatch(parts[0]):
        return None
    try:
        return parts[0], Problem.from_key(parts[1]), parts[2]
    except (ValueError, KeyError, TypeError):
        return None


def study_history(study: optuna.Study, space: str) -> StudyHistory:
    trials = study.get_trials(deepcopy=False)
    state = optuna.trial.TrialState
    # a repeated proposal is answered from the study without measuring: it is not a new point
    measured = [t for t in trials if t.state == state.COMPLETE and _number(t.value) is not None
                and not t.user_attrs.get("duplicate")]
    failures = Counter(str(t.user_attrs.get("failure", "unknown")) for t in trials
                       if t.state == state.FAIL and not t.user_attrs.get("duplicate"))
    rejected = sum(t.state == state.PRUNED for t in trials)
    if rejected:
        failures["rejected"] = rejected
    history = StudyHistory(study.study_name, space, [(t.number, float(t.value)) for t in measured],
                           dict(failures.most_common()))
    history.importances, history.importance_note = _importances(measured)
    return history


def _importances(measured: list[Any]) -> tuple[dict[str, float], str]:
    if len(measured) < MIN_TRIALS_FOR_IMPORTANCE:
        return {}, (f"{len(measured)} measured trial(s): too few for parameter importances "
                    f"(at least {MIN_TRIALS_FOR_IMPORTANCE})")
    try:
        with optuna_quiet(), warnings.catch_warnings():  # (no INFO line for this in-memory study)
            copy = optuna.create_study(direction="maximize")  # in memory: the measured, distinct trials only
            warnings.simplefilter("ignore")
            copy.add_trials(measured)
            # PED-ANOVA needs nothing beyond Optuna (fANOVA would need scikit-learn)
            importances = optuna.importance.get_param_importances(
                copy, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except Exception as exc:
        return {}, f"parameter importances could not be computed ({type(exc).__name__}: {str(exc)[:200]})"
    if not importances:
        return {}, "no parameter was present in every measured trial"
    return {str(k): float(v) for k, v in importances.items()}, ""


def record_timing(record: Any) -> list[tuple[str, str]]:
    """The figures a record was chosen by, as `tune`'s table shows them: GPU time in steady state and
    single-call latency of what it serves and of the baseline, in microseconds, with the timing
    protocol they were measured under (records of protocol 1 have GPU times only, possibly host-bound)."""
    served = "cuBLAS" if record.is_cublas else "kernel"
    rows = [("timing protocol", f"{record.protocol}" + ("" if record.current_protocol else
                                                        " (an older protocol: the baseline's time may be host time)")),
            (f"GPU time ({served} / baseline)", f"{record.time_ms * 1e3:.1f} us / {record.cublas_ms * 1e3:.1f} us")]
    if record.latency_us and record.baseline_latency_us:
        rows.append((f"latency ({served} / baseline)",
                     f"{record.latency_us:.1f} us / {record.baseline_latency_us:.1f} us"))
    best = record.best_generated if record.is_cublas else {}
    one_call = _number(best.get("latency_ratio")) if best else record.latency_ratio
    if one_call:
        rows.append(("ratio one call at a time", f"{one_call:.3f}x"))
    if record.baselines:
        rows.append(("baselines (GPU time)", ", ".join(f"{name} {_number(ms) * 1e3:.1f} us"
                                                      for name, ms in sorted(record.baselines.items())
                                                      if _number(ms) is not None)))
    return rows


def winner_from_cache(cache: TuningCache, problem: Problem, slug: str) -> Winner | None:
    found = cache.lookup(problem, slug)
    if found is None:
        return None
    record, source = found
    timing = record_timing(record)
    serves = "cuBLAS (no generated kernel beat it by more than the noise)" if record.is_cublas else "the generated kernel"
    if record.is_cublas:
        # the cache checks the beaten kernel's config and ratio; its other figures are taken only
        # where they are numbers (records written before they were kept have none)
        best = record.best_generated
        ratio = _number(best.get("ratio"))
        tflops = _number(best.get("tflops")) or (ratio * record.cublas_tflops if ratio else record.cublas_tflops)
        return Winner(f"{source} cache", best.get("config_name", "cublas"), dict(best.get("config", {})), tflops,
                      record.cublas_tflops, ratio, _number(best.get("rel_error")), serves, False, record.date, timing)
    return Winner(f"{source} cache", record.config_name, dict(record.config), record.tflops, record.cublas_tflops,
                  record.ratio, record.rel_error, serves, True, record.date, timing)


def _number(value) -> float | None:
    return float(value) if type(value) in (int, float) and math.isfinite(value) and value >= 0 else None


def winner_from_studies(studies: list[optuna.Study]) -> Winner | None:
    best = None
    for study in studies:
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            if _number(trial.value) is not None and (best is None or trial.value > best.value):
                best = trial
    if best is None:
        return None
    return Winner("study best trial", str(best.user_attrs.get("config", f"trial {best.number}")), dict(best.params),
                  float(best.value), rel_error=_number(best.user_attrs.get("rel_error")),
                  serves="not cached: the study's best trial, not re-timed against cuBLAS")


def gather(storage: str | None, problem: Problem | None, *, cache: TuningCache | None = None,
           bench: list[Path] = (), bandwidth_gbs: float | None = None) -> Report:
    """The report of `problem` (every problem where None): its studies in `storage` (the trial curves)
    and its cache records, the user's and the shipped ones (the winner's figures). A problem with a
    record and no study is reported from its record alone; no storage at all (nothing tuned here yet)
    is no error where the cache has records."""
    named = storage_named(storage)
    cache = cache if cache is not None else TuningCache()
    missing = None
    try:
        optuna_storage, names = open_storage(storage)
    except NothingToReport as exc:  # the default storage was never made: the cache's records are still there
        optuna_storage, names, missing = None, [], exc
    parsed = {name: parse_study_name(name) for name in names}
    skipped = sorted(name for name, facts in parsed.items() if facts is None)
    chosen = {name: facts for name, facts in parsed.items()
              if facts is not None and (problem is None or facts[1].key == problem.key)}
    records_of = {slug: cache.records(slug) for slug in cache.devices()}  # (read and checked once)
    recorded = {(slug, record.problem) for slug, records in records_of.items() for _, record in records
                if problem is None or record.problem == problem.key}
    if not chosen and not recorded:
        if problem is not None:
            raise ReportInputError(f"no study of {problem.key} in {named} ({len(names)} studies there; --all reports "
                                   "every one), and no cache record of it")
        if missing is not None:
            raise NothingToReport(f"{missing} (and the cache has no tuned record)")
        raise NothingToReport(f"no autogemm study in {named}" + (f" ({len(skipped)} other studies)" if skipped else "")
                              + ", and no tuned record in the cache: tune a problem first")
    try:
        given = [(Path(path), read_results(Path(path))) for path in bench]
    except ValueError as exc:
        raise ReportInputError(str(exc)) from None
    by_problem: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for name, (slug, prob, space) in sorted(chosen.items(), key=lambda item: (item[1][0], item[1][1].key, item[0])):
        by_problem.setdefault((slug, prob.key), []).append((name, space))
    for key in sorted(recorded - set(by_problem)):  # a record and no study: its winner, no trial curves
        by_problem[key] = []
    devices = []
    for slug in sorted({slug for slug, _ in by_problem}):
        records = records_of[slug] if slug in records_of else cache.records(slug)
        documents = [(p, d) for p, d in given if name_matches(d["device"], slug)] or found_results(slug)
        problems = []
        for (device, key), studies in by_problem.items():
            if device != slug:
                continue
            loaded = [optuna.load_study(study_name=name, storage=optuna_storage) for name, _ in studies]
            prob = Problem.from_key(key)
            problems.append(ProblemReport(slug, prob, [study_history(s, space) for s, (_, space) in zip(loaded, studies)],
                                          winner_from_cache(cache, prob, slug) or winner_from_studies(loaded)))
        name = next((r.device for _, r in records), None) or next((d["device"] for _, d in documents), slug)
        sweep, sweep_source = shape_sweep(records, documents)
        devices.append(DeviceReport(slug, name, problems, measured_ceilings(records, documents),
                                    measured_bandwidth(bandwidth_gbs, documents), sweep, sweep_source))
    unmatched = [str(p) for p, d in given if not any(name_matches(d["device"], dev.slug) for dev in devices)]
    if unmatched:
        raise ReportInputError(f"--bench {', '.join(unmatched)}: measured on a device no reported study was tuned on "
                               f"({', '.join(dev.slug for dev in devices)})")
    return Report(named, devices, skipped)
