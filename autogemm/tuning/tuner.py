"""Tuning a problem: its candidate search spaces in turn, each one Optuna study per (device,
problem, search space, template version), searched by `search.search_study` under a per-machine
lock (one tuner per study), the budget shared between the spaces and the best of them returned.
"""

from __future__ import annotations

import os
import time

from ..results.cache import TuningCache
from ..measure.evaluate import Evaluator
from ..measure.isolate import keep_measuring_processes
from ..problem import Problem
from .search import search_study
from ..kernels.space import SearchSpace, candidate_space_names
from .study import Sharing, StudyLocked, lock_study, study_name_for
from .result import TuneError, TuneResult, TuneRunning, TuneStorageError

DEFAULT_TRIALS = 400
# The default budget: 30 s of search (startup and the finalists' re-timing come on top: 36 s wall
# for 4096^3 on an H100) or convergence, whichever comes first.
DEFAULT_TIMEOUT_S = 30.0
# Converged: the last PATIENCE measured trials did not raise the best TFLOP/s by more than
# CONVERGED_GAIN (search.converged; PATIENCE 0 never stops it early).
DEFAULT_PATIENCE = 100


def tune(
    problem: Problem,
    *,
    trials: int = DEFAULT_TRIALS,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    seed: int | None = 0,
    sampler: str = "tpe",
    space: SearchSpace | str | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    jobs: int | None = None,
    evaluator: Evaluator | None = None,
    cache: TuningCache | None = None,
    progress: bool = False,
    seed_configs: bool = True,
    isolate: bool = True,
    candidate_timeout: float | None = None,
    patience: int = DEFAULT_PATIENCE,
    sharing: Sharing | None = None,
) -> TuneResult | None:
    """Searches configurations for `problem` on the current GPU (or with `evaluator`), caches and
    returns the best verified one. Without `space`, every candidate space of the problem is
    searched in turn (`candidate_space_names`: a short M adds the GEMV space to the dtype's own),
    each with an even share of what is left of `trials` and `timeout`, each in its own study, and
    the best of them is returned (the cache keeps the better record by itself). `trials` counts measured candidates of this run; `timeout`
    (seconds) bounds the search, the final re-timing comes on top. With `isolate` (the default)
    candidates run in a separate process that owns the GPU, so that a faulting or hanging kernel
    costs one failed trial (`candidate_timeout` seconds at most) instead of the tune. The search
    stops early once `patience` measured trials in a row have not raised the best by more than
    CONVERGED_GAIN (0: never). With `sharing` (campaigns), other GPUs may search the same studies
    at the same time (study.Sharing); a helper's tune returns None."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if patience < 0:
        raise ValueError(f"patience must be >= 0, got {patience}")
    arguments = dict(seed=seed, sampler=sampler, storage=storage, jobs=jobs, evaluator=evaluator, cache=cache,
                     progress=progress, seed_configs=seed_configs, isolate=isolate,
                     candidate_timeout=candidate_timeout, patience=patience, sharing=sharing)
    if sharing is not None and sharing.helper and space is None:
        raise ValueError("a helper joins one study: give its space")
    names = candidate_space_names(problem, _device_for(evaluator)) if space is None else (space,)
    with keep_measuring_processes():  # one measuring process serves the spaces in turn
        return _tune_spaces(problem, names, trials, timeout, study_name, arguments)


def _tune_spaces(problem: Problem, names: tuple, trials: int, timeout: float | None, study_name: str | None,
                 arguments: dict) -> TuneResult | None:
    """`tune` over `names`, each space with an even share of what is left of the budget."""
    if len(names) == 1:
        return _tune_space(problem, names[0], trials=trials, timeout=timeout, study_name=study_name, **arguments)
    started, results, errors = time.perf_counter(), [], []
    for index, name in enumerate(names):
        left = len(names) - index
        used = sum(result.valid for result in results)
        share_timeout = None if timeout is None else max(1.0, (timeout - (time.perf_counter() - started)) / left)
        try:
            result = _tune_space(problem, name, trials=max(1, (trials - used) // left), timeout=share_timeout,
                                 study_name=f"{study_name}:{name}" if study_name else None, **arguments)
        except (TuneRunning, TuneStorageError):  # (every space's study is in that storage)
            raise
        except TuneError as exc:  # nothing measurable in this space: the others may still serve
            errors.append(f"{name}: {exc}")
            continue
        results.append(result)
        if result.interrupted:
            break  # Ctrl-C or a lost GPU: the spaces not searched yet are not started
    if not results:
        raise TuneError("; ".join(errors))
    best = max(results, key=lambda r: (not r.kept_cublas, r.ratio))
    best.searched = [(r.study_name, r.config.family, r.ratio, r.valid, r.kept_cublas) for r in results]
    best.unsearched = errors
    best.wall_s = time.perf_counter() - started
    return best


def _device_for(evaluator: Evaluator | None):
    """The device a tune measures on: the evaluator's, or the current GPU (GpuUnavailable where
    there is none, CuPy missing or no driver, rather than CuPy's own error)."""
    if evaluator is not None:
        return evaluator.device
    from ..gpu.launch import current_device
    from ..gpu.runtime import require_gpu

    require_gpu()
    return current_device()


def _tune_space(problem: Problem, space, *, trials, timeout, seed, sampler, storage, study_name, jobs, evaluator,
                cache, progress, seed_configs, isolate, candidate_timeout, patience, sharing) -> TuneResult | None:
    """`tune` over one search space."""
    started = time.perf_counter()
    space = space if isinstance(space, SearchSpace) else SearchSpace.load(space)
    device = _device_for(evaluator)
    name = study_name or study_name_for(problem, device, space)
    lock = None
    if storage != ":memory:" and not (sharing and sharing.helper):  # (a helper joins the holder's study)
        try:
            lock = lock_study(name)
        except StudyLocked as exc:
            raise TuneRunning(str(exc), name) from None
    try:
        return search_study(problem, device, name, trials=trials, timeout=timeout, seed=seed, sampler=sampler,
                            space=space, storage=storage, jobs=jobs or default_jobs(), evaluator=evaluator, cache=cache,
                            progress=progress, seed_configs=seed_configs, isolate=isolate,
                            candidate_timeout=candidate_timeout, patience=patience, started=started, sharing=sharing)
    finally:
        if lock is not None:
            lock.release()


def default_jobs() -> int:
    """Compile workers: one per CPU core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)
