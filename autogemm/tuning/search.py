"""One study's search: each trial draws the space's knobs; draws that break the space's constraints
or the config's `check` are pruned before compiling (reason recorded, budget untouched). Valid
candidates compile in worker processes a few trials ahead while the GPU verifies and times earlier
ones; compile errors, launch errors and wrong results fail their trial with the kind and message,
and the search goes on. At the end the best few are re-timed together with cuBLAS and the winner is
cached. In a campaign, other GPUs may search the same study meanwhile (study.TrialExchange).
"""

from __future__ import annotations

import random
import sys
import time
from collections import deque

import optuna

from ..results.cache import Record, TuningCache, cublas_record
from ..measure.evaluate import LATENCY_MARGIN, MIN_NOISE, FatalEvaluationError, GpuEvaluator, Measurement
from ..measure.isolate import IsolatedEvaluator
from ..results.predict import known_configs
from ..results.provenance import host, now, runtime_versions
from ..kernels.render import kernel_digest, kernel_template_hash
from .study import StudyStorageError, StudyWriter, TrialExchange, ask_params, best_configs, default_storage, make_sampler, open_study, tell_trials
from .progress import TuneProgress
from .result import TuneError, TuneResult, TuneStorageError

CONVERGED_GAIN = 0.005  # see `converged`
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


def search_study(problem, device, name, *, trials, timeout, seed, sampler, space, storage, jobs, evaluator, cache,
                 progress, seed_configs, isolate, candidate_timeout, patience, started,
                 sharing) -> TuneResult | None:
    """Searches study `name` of `problem` in `space` (see `tuner.tune` for the arguments), re-times the
    finalists with cuBLAS and caches the winner; a campaign helper's search (sharing.helper) stops
    before that and returns None."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The sampler works on an in-memory study (fast asks and tells); every finished trial is also
    # written, from a background thread, to the persistent study, from which a rerun resumes.
    persistent = None
    if storage != ":memory:":
        try:
            persistent = open_study(name, storage)
        except StudyStorageError as exc:
            raise TuneStorageError(str(exc)) from None
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
    helper = sharing is not None and sharing.helper
    if helper and not sharing.keep_helping():  # the holder left the study meanwhile: nothing to start
        return None
    # the evaluator (a measuring process, compile workers) starts once the study storage is open
    owns_evaluator = evaluator is None
    if evaluator is None:
        if isolate:
            evaluator = IsolatedEvaluator(problem, device, jobs, seed=seed or 0,
                                          timeout=candidate_timeout)
        else:
            evaluator = GpuEvaluator(problem, device, jobs, seed=seed or 0)
    if helper and seed is not None:  # another seed than the holder's: the two samplers propose differently
        seed = (seed + 1 + random.Random().randrange(1 << 30)) % (1 << 32)  # (numpy's seeds are 32-bit)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(sampler, seed, space))
    exchange = None
    if persistent is not None:
        finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
        loaded = persistent.get_trials(deepcopy=False, states=finished)
        study.add_trials(loaded)
        if sharing is not None:
            exchange = TrialExchange(persistent, study, loaded)
            if sharing.announce:
                sharing.announce(name)
    writer = StudyWriter(persistent)
    known: dict[str, float] = {}  # config name -> TFLOP/s measured
    failed_before: dict[str, Measurement] = {}  # a failed config is not measured twice
    remember_trials(study.get_trials(deepcopy=False), known, failed_before)
    if known and progress is True:
        print(f"resuming study {name} ({len(known)} configurations measured)", file=sys.stderr)
    seeded = 0
    if seed_configs and not helper:  # (the holder enqueued the seeds)
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
    lookahead = max(2, min(8, jobs))
    pending: deque = deque()  # (config, [trials], handle)
    valid = rejected = failed = duplicates = measured_elsewhere = 0
    failures: dict[str, int] = {}
    history: list[float] = []
    best_ms: float | None = min((problem.flops / v / 1e9 for v in known.values() if v), default=None)
    idle_asks = 0  # consecutive proposals that measured nothing new
    consecutive_failures = 0
    interrupted = False
    stopped = ""

    def record_for(config, measurement: Measurement, cublas_ms: float, provisional: bool, latency=None) -> Record:
        return Record(
            problem=problem.key, family=config.family,
            config={k: v for k, v in config.to_dict().items() if k != "family"}, config_name=config.name,
            time_ms=measurement.time_ms, tflops=measurement.tflops, cublas_ms=cublas_ms,
            cublas_tflops=problem.flops / cublas_ms / 1e9, ratio=cublas_ms / measurement.time_ms,
            rel_error=measurement.rel_error if measurement.rel_error is not None else float("nan"),
            template_hash=kernel_template_hash(config.template), device=device.name, versions=runtime_versions(), date=now(), host=host(),
            source_digest=kernel_digest(config, problem),
            trials={"valid": valid, "rejected": rejected, "failed": failed}, wall_s=time.perf_counter() - started,
            study=name, provisional=provisional, protocol=evaluator.protocol,
            latency_us=latency.kernel_us if latency else 0.0, baseline_latency_us=latency.baseline_us if latency else 0.0,
            baselines=dict(evaluator.baselines),
        )

    def out_of_time() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    offered = space.knob_choices(problem, device)  # a study's knobs keep their choices from trial to trial
    rescue_rng = random.Random(seed)
    rescued: set[str] = set()

    def take_in(trials_elsewhere) -> None:
        """Other workers' trials of this study: measured there, never measured here again, and
        counted in this run's `trials` (the problem gets that many measurements, by any GPU)."""
        nonlocal measured_elsewhere
        measured_elsewhere += remember_trials(trials_elsewhere, known, failed_before)

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
        while (valid + measured_elsewhere < trials and not out_of_time()
               and consecutive_failures < MAX_CONSECUTIVE_FAILURES):
            if exchange is not None and exchange.due():
                take_in(exchange.pull())
                if helper and not sharing.keep_helping():
                    stopped = "the holder of the problem left this study"
                    break
            while (len(pending) < lookahead and valid + measured_elsewhere + len(pending) < trials
                   and not out_of_time() and idle_asks < MAX_IDLE_PROPOSALS):
                trial = study.ask()
                if exchange is not None:
                    exchange.tag(trial)
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
                    # Kept as it is found: a killed tune still leaves its best verified kernel
                    # (a helper's measurements go to the holder's study; the holder caches)
                    if not helper:
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
        if helper and owns_evaluator:
            evaluator.close()
    if helper:  # the holder re-times and decides, with what this search added to the study
        return None
    if exchange is not None:  # the holder: helpers leave the study; their last trials count
        if sharing.announce:
            sharing.announce(None)
        take_in(exchange.pull())

    latency = None  # the winner's and the served cuBLAS fallback's, one call at a time
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
            # it must also win one call at a time, host time and all, as matmul serves it
            latency = evaluator.single_call(winner)
    finally:
        if owns_evaluator:
            evaluator.close()

    wall = time.perf_counter() - started
    study_trials = sum(1 for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                       if "config" in t.user_attrs and not t.user_attrs.get("duplicate"))
    # an interrupted tune's best stays provisional: served, and replaced by the next finished tune
    record = record_for(winner, chosen, cublas_ms, provisional=interrupted, latency=latency)
    rel_error = record.rel_error  # the best generated kernel's, whichever is kept
    kept_cublas = record.ratio <= 1 + noise or (latency is not None and latency.ratio <= 1 + LATENCY_MARGIN)
    if kept_cublas:  # within the noise of cuBLAS or slower: cuBLAS is the winner, with its figures
        record = cublas_record(record, latency.ratio if latency else None)
    record.trials["in_study"] = study_trials
    if exchange is not None:
        record.trials["other_gpus"] = exchange.pulled  # trials helpers measured into this study
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
        kept_cublas=kept_cublas, noise=noise, seeded=seeded, latency=latency,
    )


def remember_trials(trials, known: dict[str, float], failed_before: dict[str, Measurement]) -> int:
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
            failed_before.setdefault(config, Measurement.failure(t.user_attrs["failure"], t.user_attrs.get("message", "")))
    return new


def converged(history: list[float], patience: int) -> bool:
    """Whether the search has converged: the best of `history` (TFLOP/s of the measured trials, in
    order) beats the best before its last `patience` trials by no more than CONVERGED_GAIN."""
    if patience <= 0 or len(history) <= patience:
        return False
    return max(history) <= (1 + CONVERGED_GAIN) * max(history[:-patience])
