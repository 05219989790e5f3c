"""The search: one Optuna study per (device, problem, search space, template version).

Each trial draws the space's knobs; draws that break the space's constraints or the config's
`check` are pruned before compiling (reason recorded, budget untouched). Valid candidates compile
in worker processes a few trials ahead while the GPU verifies and times earlier ones; compile
errors, launch errors and wrong results fail their trial with the kind and message, and the search
goes on. At the end the best few are re-timed together with cuBLAS and the winner is cached.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections import deque

import optuna

from .cache import Record, TuningCache, cublas_record
from .evaluate import MIN_NOISE, SINGLE_CALL_MS, Evaluator, FatalEvaluationError, GpuEvaluator, Measurement
from .isolate import IsolatedEvaluator
from .predict import known_configs
from .provenance import host, now, runtime_versions
from .problem import Problem
from .render import kernel_digest, kernel_template_hash
from .space import SearchSpace, candidate_space_names
from .study import (StudyLocked, StudyStorageError, StudyWriter, ask_params, best_configs, default_storage,
                    lock_study, make_sampler, open_study, study_name_for, tell_trials)
from .tune_progress import TuneProgress
from .tune_result import TuneResult

DEFAULT_TRIALS = 400
# The default budget: 30 s of search (startup and the finalists' re-timing come on top: 36 s wall
# for 4096^3 on an H100) or convergence, whichever comes first.
DEFAULT_TIMEOUT_S = 30.0
# Converged: the last PATIENCE measured trials did not raise the best TFLOP/s by more than
# CONVERGED_GAIN (the search stops; PATIENCE 0 never stops it early).
DEFAULT_PATIENCE = 100
CONVERGED_GAIN = 0.005
FINALISTS = 5
# Consecutive proposals that are rejected or already measured before the search counts as converged.
MAX_IDLE_PROPOSALS = 300
# The sampler can fix on a corner of a heavily constrained space where nearly every draw breaks a
# rule (TPE after a failed first candidate, with several in flight). After this many idle proposals
# in a row, RESCUE_CONFIGS valid configurations drawn uniformly (not yet measured) are enqueued;
# RESCUE_DRAWS uniform draws at most are spent finding them.
RESCUE_AFTER = 40
RESCUE_CONFIGS = 4
RESCUE_DRAWS = 20_000
# Consecutive failed candidates after which the search stops (a broken toolchain or GPU, say).
MAX_CONSECUTIVE_FAILURES = 50


class TuneError(RuntimeError):
    pass


class TuneRunning(TuneError):
    """Another tuner is running this study on this machine (`study`: its name)."""

    def __init__(self, message: str, study: str):
        super().__init__(message)
        self.study = study


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
) -> TuneResult:
    """Searches configurations for `problem` on the current GPU (or with `evaluator`), caches and
    returns the best verified one. Without `space`, every candidate space of the problem is
    searched in turn (`candidate_space_names`: a short M adds the GEMV space to the dtype's own),
    each with an even share of what is left of `trials` and `timeout`, each in its own study, and
    the best of them is returned (the cache keeps the better record by itself). `trials` counts measured candidates of this run; `timeout`
    (seconds) bounds the search, the final re-timing comes on top. With `isolate` (the default)
    candidates run in a separate process that owns the GPU, so that a faulting or hanging kernel
    costs one failed trial (`candidate_timeout` seconds at most) instead of the tune. The search
    stops early once `patience` measured trials in a row have not raised the best by more than
    CONVERGED_GAIN (0: never)."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if patience < 0:
        raise ValueError(f"patience must be >= 0, got {patience}")
    arguments = dict(seed=seed, sampler=sampler, storage=storage, jobs=jobs, evaluator=evaluator, cache=cache,
                     progress=progress, seed_configs=seed_configs, isolate=isolate,
                     candidate_timeout=candidate_timeout, patience=patience)
    names = candidate_space_names(problem, _device_for(evaluator)) if space is None else (space,)
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
        except TuneRunning:
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
    """The device a tune measures on: the evaluator's, or the current GPU (CuPy missing: say which
    extra to install)."""
    if evaluator is not None:
        return evaluator.device
    from .launch import current_device
    from .runtime import cupy

    cupy()
    return current_device()


def _tune_space(problem: Problem, space, *, trials, timeout, seed, sampler, storage, study_name, jobs, evaluator,
                cache, progress, seed_configs, isolate, candidate_timeout, patience) -> TuneResult:
    """`tune` over one search space."""
    started = time.perf_counter()
    space = space if isinstance(space, SearchSpace) else SearchSpace.load(space)
    device = _device_for(evaluator)
    name = study_name or study_name_for(problem, device, space)
    lock = None
    if storage != ":memory:":
        try:
            lock = lock_study(name)
        except StudyLocked as exc:
            raise TuneRunning(str(exc), name) from None
    try:
        return _tune(problem, device, name, trials=trials, timeout=timeout, seed=seed, sampler=sampler,
                     space=space, storage=storage, jobs=jobs, evaluator=evaluator, cache=cache, progress=progress,
                     seed_configs=seed_configs, isolate=isolate, candidate_timeout=candidate_timeout,
                     patience=patience, started=started)
    finally:
        if lock is not None:
            lock.release()


def _tune(problem, device, name, *, trials, timeout, seed, sampler, space, storage, jobs, evaluator, cache,
          progress, seed_configs, isolate, candidate_timeout, patience, started) -> TuneResult:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The sampler works on an in-memory study (fast asks and tells); every finished trial is also
    # written, from a background thread, to the persistent study, from which a rerun resumes.
    persistent = None
    if storage != ":memory:":
        try:
            persistent = open_study(name, storage)
        except StudyStorageError as exc:
            raise TuneError(str(exc)) from None
        storage = storage or default_storage()
    cache = cache if cache is not None else TuningCache()
    cache_errors: list[str] = []

    def keep(record: Record):
        """Caches a record; where the cache cannot be written (read-only, full), says so once and
        goes on: the tune's result is reported all the same."""
        try:
            return cache.store(record, device.slug)
        except OSError as exc:
            if not cache_errors:
                print(f"autogemm: cannot write tuned results to {cache.directory} ({exc}); the tune goes on, "
                      "its result will not be cached", file=sys.stderr)
            cache_errors.append(f"{type(exc).__name__}: {exc}")
            return None
    # the evaluator (a measuring process, compile workers) starts once the study storage is open
    owns_evaluator = evaluator is None
    if evaluator is None:
        if isolate:
            evaluator = IsolatedEvaluator(problem, device, jobs or default_jobs(), seed=seed or 0,
                                          timeout=candidate_timeout)
        else:
            evaluator = GpuEvaluator(problem, device, jobs or default_jobs(), seed=seed or 0)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(sampler, seed, space))
    if persistent is not None:
        finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
        study.add_trials(persistent.get_trials(deepcopy=False, states=finished))
    writer = StudyWriter(persistent)
    completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    known: dict[str, float] = {t.user_attrs["config"]: t.value for t in completed if "config" in t.user_attrs}
    failed_before: dict[str, Measurement] = {  # a failed config is not measured twice
        t.user_attrs["config"]: Measurement.failure(t.user_attrs["failure"], t.user_attrs.get("message", ""))
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
        if "config" in t.user_attrs and t.user_attrs.get("failure") not in (None, "cancelled")
    }
    if known and progress is True:
        print(f"resuming study {name} ({len(known)} configurations measured)", file=sys.stderr)
    seeded = 0
    if seed_configs:
        # What is known comes first (what serves this problem now, the nearest tuned problems'
        # winners, the model's best predictions): a tune never ends below what was serving. The
        # space's own seeds follow in a new study. What the space's problem rules exclude is not
        # enqueued (it would be pruned); a better cached record of it stays in the cache all the same.
        for config in known_configs(problem, device, cache, space) + (space.seeds if not study.trials else []):
            values = space.knob_values(config)
            if values is not None and not config.check(problem, device) and \
                    space.evaluate(values, problem, device)[0] is not None:
                study.enqueue_trial(values, skip_if_exists=True)
                seeded += 1

    progress_bar = TuneProgress(progress, trials, problem, evaluator)
    deadline = None if timeout is None else started + timeout
    lookahead = max(2, min(8, jobs or default_jobs()))
    pending: deque = deque()  # (config, [trials], handle)
    valid = rejected = failed = duplicates = 0
    failures: dict[str, int] = {}
    history: list[float] = []
    best_ms: float | None = min((problem.flops / v / 1e9 for v in known.values() if v), default=None)
    idle_asks = 0  # consecutive proposals that measured nothing new
    consecutive_failures = 0
    interrupted = False
    stopped = ""

    def record_for(config, measurement: Measurement, cublas_ms: float, provisional: bool) -> Record:
        return Record(
            problem=problem.key, family=config.family,
            config={k: v for k, v in config.to_dict().items() if k != "family"}, config_name=config.name,
            time_ms=measurement.time_ms, tflops=measurement.tflops, cublas_ms=cublas_ms,
            cublas_tflops=problem.flops / cublas_ms / 1e9, ratio=cublas_ms / measurement.time_ms,
            rel_error=measurement.rel_error if measurement.rel_error is not None else float("nan"),
            template_hash=kernel_template_hash(config.template), device=device.name, versions=runtime_versions(), date=now(), host=host(),
            source_digest=kernel_digest(config, problem),
            trials={"valid": valid, "rejected": rejected, "failed": failed}, wall_s=time.perf_counter() - started,
            study=name, provisional=provisional,
        )

    def out_of_time() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    offered = space.knob_choices(problem, device)  # a study's knobs keep their choices from trial to trial
    rescue_rng = random.Random(seed)
    rescued: set[str] = set()

    def rescue() -> None:
        """Enqueues a few valid, unmeasured configurations drawn uniformly (see RESCUE_AFTER)."""
        found = 0
        for config, values in space.uniform_draws(problem, device, rescue_rng, RESCUE_DRAWS):
            name = config.name
            if name in known or name in failed_before or name in rescued or any(p[0].name == name for p in pending):
                continue
            rescued.add(name)
            study.enqueue_trial(values)
            found += 1
            if found == RESCUE_CONFIGS:
                break

    try:
        while valid < trials and not out_of_time() and consecutive_failures < MAX_CONSECUTIVE_FAILURES:
            while (len(pending) < lookahead and valid + len(pending) < trials and not out_of_time()
                   and idle_asks < MAX_IDLE_PROPOSALS):
                trial = study.ask()
                config, broken = space.evaluate(ask_params(trial, space, offered), problem, device)
                reasons = [f"space: {rule}" for rule in broken] if config is None else config.check(problem, device)
                if idle_asks and idle_asks % RESCUE_AFTER == 0:
                    rescue()
                if reasons:
                    trial.set_user_attr("rejected", reasons)
                    writer.put(study.tell(trial, state=optuna.trial.TrialState.PRUNED))
                    rejected += 1
                    idle_asks += 1
                    continue
                trial.set_user_attr("config", config.name)
                if config.name in failed_before:
                    trial.set_user_attr("duplicate", True)
                    tell_trials(study, writer, [trial], failed_before[config.name])
                    duplicates += 1
                    idle_asks += 1
                    continue
                if config.name in known:  # measured before: answer from the study
                    trial.set_user_attr("duplicate", True)
                    writer.put(study.tell(trial, known[config.name]))
                    duplicates += 1
                    idle_asks += 1
                    continue
                waiting = next((p for p in pending if p[0].name == config.name), None)
                if waiting:
                    waiting[1].append(trial)
                    duplicates += 1
                    idle_asks += 1
                    continue
                idle_asks = 0
                pending.append((config, [trial], evaluator.start(config)))
            if not pending:
                break  # the sampler proposes nothing new
            config, asked, handle = pending.popleft()
            measurement = evaluator.finish(handle, best_ms)
            tell_trials(study, writer, asked, measurement)
            if measurement.ok:
                valid += 1
                consecutive_failures = 0
                known[config.name] = measurement.tflops
                history.append(measurement.tflops)
                if best_ms is None or measurement.time_ms < best_ms:
                    best_ms = measurement.time_ms
                    # Kept as it is found: a killed tune still leaves its best verified kernel.
                    keep(record_for(config, measurement, evaluator.cublas_ms, provisional=True))
            else:
                failed += 1
                consecutive_failures += 1
                failed_before[config.name] = measurement
                failures[measurement.kind] = failures.get(measurement.kind, 0) + 1
            progress_bar.update(measurement.ok, best_ms, rejected, failed)
            if measurement.ok and converged(history, patience):
                stopped = (f"converged: the last {patience} measured trials gained less than "
                           f"{CONVERGED_GAIN:.1%} on the best")
                break
    except KeyboardInterrupt:
        interrupted, stopped = True, "interrupted (Ctrl-C)"
    except FatalEvaluationError as exc:
        interrupted, stopped = True, str(exc)
    finally:
        for _, asked, handle in pending:
            evaluator.cancel(handle)
            tell_trials(study, writer, asked, Measurement.failure("cancelled", "tuning stopped before it was measured"))
        progress_bar.close()
        writer.close()

    single_call = None  # cuBLAS's latency over the winner's, one call at a time
    try:
        finalists = best_configs(study, space, FINALISTS)
        if not finalists:
            raise TuneError(
                f"no configuration of {space.path.name} was measured for {problem} "
                f"({rejected} rejected, {failed} failed: {failures or 'none'})"
            )
        if interrupted:
            # Ctrl-C or a lost GPU: keep the best verified measurement as it stands, without re-timing
            winner = finalists[0]
            ms = problem.flops / known[winner.name] / 1e9 if winner.name in known else None
            if ms is None:
                raise TuneError("interrupted before any configuration was measured")
            chosen = Measurement(ok=True, time_ms=ms, tflops=known[winner.name])
            cublas_ms = evaluator.cublas_ms
            noise = MIN_NOISE
        else:
            remeasured, cublas_ms = evaluator.retime(finalists)
            ranked = sorted((m.time_ms, i) for i, m in enumerate(remeasured) if m.ok)
            if not ranked:
                raise TuneError(f"every finalist failed its re-check: {[m.kind for m in remeasured]}")
            winner, chosen = finalists[ranked[0][1]], remeasured[ranked[0][1]]
            if chosen.rel_error is None:
                chosen.rel_error = next((m.rel_error for m in remeasured if m.ok and m.rel_error), None)
            noise = evaluator.retime_noise
            if cublas_ms / chosen.time_ms > 1 + noise and chosen.time_ms < SINGLE_CALL_MS:
                # a short call: it must also win one call at a time, host time and all, as matmul
                # serves it
                single_call = evaluator.single_call_ratio(winner)
    finally:
        if owns_evaluator:
            evaluator.close()

    wall = time.perf_counter() - started
    study_trials = sum(1 for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                       if "config" in t.user_attrs and not t.user_attrs.get("duplicate"))
    # an interrupted tune's best stays provisional: served, and replaced by the next finished tune
    record = record_for(winner, chosen, cublas_ms, provisional=interrupted)
    rel_error = record.rel_error  # the best generated kernel's, whichever is kept
    kept_cublas = record.ratio <= 1 + noise or (single_call is not None and single_call <= 1 + noise)
    if kept_cublas:  # within the noise of cuBLAS or slower: cuBLAS is the winner, with its figures
        record = cublas_record(record, single_call)
    record.trials["in_study"] = study_trials
    record.wall_s = wall
    cache_path = keep(record)
    return TuneResult(
        problem=problem, device=device, config=winner, time_ms=chosen.time_ms, tflops=chosen.tflops,
        rel_error=rel_error, cublas_ms=cublas_ms, valid=valid, rejected=rejected, failed=failed,
        duplicates=duplicates, study_trials=study_trials, wall_s=wall, study_name=name,
        storage=storage, cache_path=str(cache_path) if cache_path else None, interrupted=interrupted,
        history=history, failures=failures, stopped=stopped,
        restarts=evaluator.restarts, restart_s=evaluator.restart_s, cache_error=cache_errors[-1] if cache_errors else "",
        unstored_kernels=evaluator.unstored, storage_error=evaluator.storage_error,
        kept_cublas=kept_cublas, noise=noise, seeded=seeded, single_call_ratio=single_call,
    )


def converged(history: list[float], patience: int) -> bool:
    """Whether the search has converged: the best of `history` (TFLOP/s of the measured trials, in
    order) beats the best before its last `patience` trials by no more than CONVERGED_GAIN."""
    if patience <= 0 or len(history) <= patience:
        return False
    return max(history) <= (1 + CONVERGED_GAIN) * max(history[:-patience])


def default_jobs() -> int:
    """Compile workers: one per CPU core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)
