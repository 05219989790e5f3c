"""Tuning a problem: its candidate search spaces in turn, each one Optuna study per (device,
problem, search space, template version), searched by `search.SearchLoop` under a per-machine
lock (one tuner per study), the budget shared between the spaces and the best of them returned.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from ..gpu import launch
from ..results.cache import TuningCache
from ..measure.evaluate import Evaluator
from ..measure.isolate import keep_measuring_processes
from ..measure.timing import sustained_warmup_ms
from ..epilogue import require_measurable
from ..problem import Problem
from ..gpu.runtime import require_gpu
from .options import TuneOptions, default_jobs, tune_options
from .search import SearchLoop
from ..kernels.space import SearchSpace, candidate_space_names
from .study import Sharing, StudyLocked, lock_study, study_name_for
from .result import TuneError, TuneResult, TuneRunning, TuneStorageError


def tune(problem: Problem, options: TuneOptions | None = None, *, evaluator: Evaluator | None = None,
         cache: TuningCache | None = None, progress: bool | Callable[..., Any] = False, sharing: Sharing | None = None,
         **option_values: Any) -> TuneResult | None:
    """Searches configurations for `problem` on the current GPU (or with `evaluator`), caches and
    returns the best verified one. What to search and for how long is `options` (TuneOptions), or
    its fields given by name (`tune(problem, trials=100, timeout=None)`), which replace the
    defaults or those of `options`.

    Without `options.space`, every candidate space of the problem is searched in turn
    (`candidate_space_names`: a short M adds the GEMV space to the dtype's own), each with an even
    share of what is left of `trials` and `timeout`, each in its own study, and the best of them
    is returned (the cache keeps the better record by itself). `trials` counts measured candidates
    of this run; `timeout` (seconds) bounds the search, the final re-timing comes on top. With
    `isolate` (the default) candidates run in a separate process that owns the GPU, so that a
    faulting or hanging kernel costs one failed trial (`candidate_timeout` seconds at most)
    instead of the tune. The search stops early once `patience` measured trials in a row have not
    raised the best by more than CONVERGED_GAIN (0: never).

    `cache`: where the winner goes (the user's cache by default); `progress`: True draws a bar (or
    log lines), a callable gets (measured trials, best TFLOP/s, ratio to cuBLAS) after each trial.
    With `sharing` (campaigns), other GPUs may search the same studies at the same time
    (study.Sharing); a helper's tune returns None."""
    require_measurable(problem, "not tuned")
    sustained_warmup_ms()  # (a bad AUTOGEMM_SUSTAINED_WARMUP_MS is named now, not after the search)
    options = tune_options(options, **option_values)
    if sharing is not None and sharing.helper and options.space is None:
        raise ValueError("a helper joins one study: give its space")
    names = candidate_space_names(problem, _device_for(evaluator)) if options.space is None else (options.space,)
    collaborators = dict(evaluator=evaluator, cache=cache, progress=progress, sharing=sharing)
    with keep_measuring_processes():  # one measuring process serves the spaces in turn
        return _tune_spaces(problem, names, options, collaborators)


def _tune_spaces(problem: Problem, spaces: tuple[Any, ...], options: TuneOptions, collaborators: dict[str, Any]) -> TuneResult | None:
    """`tune` over `spaces`, each with an even share of what is left of the budget."""
    if len(spaces) == 1:
        return _tune_space(problem, dataclasses.replace(options, space=spaces[0]), **collaborators)
    started, results, errors = time.perf_counter(), [], []
    for index, space in enumerate(spaces):
        left = len(spaces) - index
        used = sum(result.valid for result in results)
        timeout = options.timeout
        share = dataclasses.replace(
            options, space=space, trials=max(1, (options.trials - used) // left),
            timeout=None if timeout is None else max(1.0, (timeout - (time.perf_counter() - started)) / left),
            study_name=f"{options.study_name}:{space}" if options.study_name else None)
        try:
            result = _tune_space(problem, share, **collaborators)
        except (TuneRunning, TuneStorageError):  # (every space's study is in that storage)
            raise
        except TuneError as exc:  # nothing measurable in this space: the others may still serve
            errors.append(f"{space}: {exc}")
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
    require_gpu()
    return launch.current_device()


def _tune_space(problem: Problem, options: TuneOptions, *, evaluator, cache, progress, sharing) -> TuneResult | None:
    """`tune` over one search space (`options.space`)."""
    started = time.perf_counter()
    space = options.space if isinstance(options.space, SearchSpace) else SearchSpace.load(options.space)
    device = _device_for(evaluator)
    name = options.study_name or study_name_for(problem, device, space)
    lock = None
    if options.storage != ":memory:" and not (sharing and sharing.helper):  # (a helper joins the holder's study)
        try:
            lock = lock_study(name)
        except StudyLocked as exc:
            raise TuneRunning(str(exc), name) from None
    try:
        settled = dataclasses.replace(options, space=space, study_name=name, jobs=options.jobs or default_jobs())
        return SearchLoop(problem, device, settled, evaluator=evaluator, cache=cache, progress=progress,
                          sharing=sharing, started=started).run()
    finally:
        if lock is not None:
            lock.release()
