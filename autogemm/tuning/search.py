"""One study's search: each trial draws the space's knobs; draws that break the space's constraints
or the config's `check` are pruned before compiling (reason recorded, budget untouched). Valid
candidates compile in worker processes a few trials ahead while the GPU verifies and times earlier
ones; compile errors, launch errors and wrong results fail their trial with the kind and message,
and the search goes on. At the end the best few are re-timed together with cuBLAS and the winner is
cached. In a campaign, other GPUs may search the same study meanwhile (study.TrialExchange).

`SearchLoop.run` reads top to bottom: open the study, enqueue what is known, search (`_search`:
propose candidates ahead, measure the next one, until the budget, the deadline, convergence or
failures stop it), then choose the winner and cache it.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from typing import Any

import optuna

from .. import interrupts
from ..results.cache import TuningCache, cublas_record
from ..measure.evaluate import Evaluator, FatalEvaluationError, GpuEvaluator, Measurement
from ..measure.isolate import IsolatedEvaluator
from ..problem import Device, Problem
from ..results.predict import known_configs
from ..kernels.space import SearchSpace
from .options import CONVERGED_GAIN, TuneOptions
from .outcome import RecordKeeper, Winner, best_so_far, keeps_cublas, retimed_best
from .study import (Sharing, StudyStorageError, StudyWriter, TrialExchange, ask_params, best_configs, default_storage,
                    make_sampler, open_study, optuna_quiet, remember_trials, tell_trials)
from .progress import TuneProgress
from .search_state import InFlight, SearchCounters, converged
from .wave_seeds import wave_ranked
from .result import TuneError, TuneResult, TuneStorageError

log: logging.Logger = logging.getLogger(__name__)
FINALISTS = 5
# Consecutive proposals that are rejected or already measured before the search counts as converged.
MAX_IDLE_PROPOSALS = 300
# The sampler can fix on a corner of a heavily constrained space where nearly every draw breaks a
# rule (TPE after a failed first candidate, with several in flight). After this many idle proposals
# in a row, RESCUE_CONFIGS valid configurations drawn uniformly (not yet measured) are enqueued;
# RESCUE_DRAWS uniform draws at most are spent finding them (a space of fewer knob combinations is gone
# through whole). A rescue that finds none ends the proposals: repeating it (about 5 s of host time each)
# took 37 s of a 75 s tune whose failures left its trials unreached (docs/tuning.md).
RESCUE_AFTER = 40
RESCUE_CONFIGS = 4
RESCUE_DRAWS = 20_000
# Consecutive failed candidates after which the search stops (a broken toolchain or GPU, say).
MAX_CONSECUTIVE_FAILURES = 50


class SearchLoop:
    """The search of one study (see the module's text). `run()` searches and, for the holder of the
    study (not a campaign's helper: sharing.helper), re-times the finalists with cuBLAS, caches
    the winner and returns the TuneResult; a helper's search returns None."""

    def __init__(self, problem: Problem, device: Device, options: TuneOptions, *, evaluator: Evaluator | None,
                 cache: TuningCache | None, progress: Any, sharing: Sharing | None, started: float):
        """`options` as the tuner settles them for one space (tuner._tune_space): the space loaded,
        the study named, the compile jobs counted. `progress`: as `tuner.tune` takes it; `started`:
        the time.perf_counter() at which the tune began (its wall time and deadline count from it)."""
        self.problem, self.device, self.options = problem, device, options
        self.space: SearchSpace = options.space
        self.name: str = options.study_name
        self.storage = options.storage  # the default's URL once the study is open
        self.seed = options.seed  # a helper's differs from the holder's (see _open_study)
        self.evaluator, self.owns_evaluator = evaluator, evaluator is None
        self.cache, self.progress, self.sharing, self.started = cache, progress, sharing, started
        self.helper = sharing is not None and sharing.helper
        self.deadline = None if options.timeout is None else started + options.timeout
        self.lookahead = max(2, min(8, options.jobs))  # candidates compiling ahead of the GPU
        self.counters = SearchCounters()
        self.known: dict[str, float] = {}  # config name -> TFLOP/s measured
        self.failed_before: dict[str, Measurement] = {}  # a failed config is not measured twice
        self.pending: deque[InFlight] = deque()
        self.rescued: set[str] = set()  # configurations enqueued by `_rescue`
        self.rescues_left = True  # until a rescue finds nothing
        self.seed_names: set[str] = set()  # configurations enqueued before the search (measured past the deadline)
        self.best_ms: float | None = None
        self.interrupted = False  # Ctrl-C or a lost GPU: the best so far is kept without re-timing
        self.stopped = ""  # why the search stopped before its budget, if it did
        self.records: RecordKeeper | None = None  # (once the evaluator has started)
        self.persistent: optuna.Study | None = None  # the stored study, from which a rerun resumes
        self.study: optuna.Study | None = None
        self.exchange: TrialExchange | None = None
        self.writer: StudyWriter | None = None
        self.progress_bar: TuneProgress | None = None
        self.offered: dict[str, tuple[Any, ...]] | None = None  # each knob's choices, the same from trial to trial
        self.rescue_rng: random.Random | None = None

    def run(self) -> TuneResult | None:
        """Searches the study; returns the tune's result, or None for a helper (the holder decides)."""
        with optuna_quiet():  # (Optuna's INFO lines for this search only: the caller's own studies keep theirs)
            return self._run()

    def _run(self) -> TuneResult | None:
        self._open_storage()
        if self.helper and not self.sharing.keep_helping():  # the holder left the study meanwhile: nothing to start
            return None
        self._start_evaluator()  # (once the study storage is open)
        self._open_study()
        if self.options.seed_configs and not self.helper:  # (the holder enqueued the seeds)
            self._enqueue_known_configs()
        self._search()
        if self.helper:  # the holder re-times and decides, with what this search added to the study
            return None
        if self.exchange is not None:  # the holder: helpers leave the study; their last trials count
            if self.sharing.announce:
                self.sharing.announce(None)
            self._take_in(self.exchange.pull())
        return self._result(self._choose_winner())

    # ---- before the search -----------------------------------------------------------------------
    def _open_storage(self) -> None:
        """The persistent study, and the cache. The sampler works on an in-memory study (fast asks
        and tells); every finished trial is also written, from a background thread, to the
        persistent study, from which a rerun resumes."""
        if self.storage != ":memory:":
            try:
                self.persistent = open_study(self.name, self.storage)
            except StudyStorageError as exc:
                raise TuneStorageError(str(exc)) from None
            self.storage = self.storage or default_storage()
        self.cache = self.cache if self.cache is not None else TuningCache()

    def _start_evaluator(self) -> None:
        """The evaluator given, or one of this search's own: a measuring process and compile workers."""
        options = self.options
        if self.evaluator is None and options.isolate:
            self.evaluator = IsolatedEvaluator(self.problem, self.device, options.jobs, seed=self.seed or 0,
                                               timeout=options.candidate_timeout)
        elif self.evaluator is None:
            self.evaluator = GpuEvaluator(self.problem, self.device, options.jobs, seed=self.seed or 0)
        self.records = RecordKeeper(self.cache, self.problem, self.device, self.name, self.evaluator, self.started)

    def _open_study(self) -> None:
        """The in-memory study with the persistent one's finished trials, what they measured, and
        (in a campaign) the exchange with the other workers searching it."""
        # a helper's seed differs from the holder's: the two samplers propose differently
        if self.helper and self.seed is not None:
            self.seed = (self.seed + 1 + random.Random().randrange(1 << 30)) % (1 << 32)  # (numpy's seeds are 32-bit)
        self.study = optuna.create_study(direction="maximize",
                                         sampler=make_sampler(self.options.sampler, self.seed, self.space))
        if self.persistent is not None:
            states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
            loaded = self.persistent.get_trials(deepcopy=False, states=states)
            self.study.add_trials(loaded)
            if self.sharing is not None:
                self.exchange = TrialExchange(self.persistent, self.study, loaded)
                if self.sharing.announce:
                    self.sharing.announce(self.name)
        self.writer = StudyWriter(self.persistent)
        remember_trials(self.study.get_trials(deepcopy=False), self.known, self.failed_before)
        if self.known and self.progress is True:
            log.info("resuming study %s (%d configurations measured)", self.name, len(self.known))

    def _enqueue_known_configs(self) -> None:
        """What is known comes first (what serves this problem now, the nearest tuned problems'
        winners, the model's best predictions): a tune never ends below what was serving. In a new
        study the configurations whose work fills the GPU best follow (one per tile shape, ranked by
        families/waves.py), then the space's own seeds. What the space's problem rules exclude is not
        enqueued (it would be pruned); a better cached record of it stays in the cache all the same."""
        problem, device, space = self.problem, self.device, self.space
        new_study_seeds = wave_ranked(space, problem, device) + space.seeds if not self.study.trials else []
        for config in known_configs(problem, device, self.cache, space) + new_study_seeds:
            values = space.knob_values(config)
            if values is not None and not config.check(problem, device) and \
                    space.evaluate(values, problem, device)[0] is not None:
                self.study.enqueue_trial(values, skip_if_exists=True)
                self.counters.seeded += 1
                self.seed_names.add(config.name)

    # ---- the search --------------------------------------------------------------------------------
    def _search(self) -> None:
        """Measures candidates, `lookahead` of them compiling ahead, until `trials` are measured (here
        or elsewhere), the deadline passes, the search converges, the sampler proposes nothing new,
        too many candidates fail in a row, the holder of a helped study leaves it, or Ctrl-C."""
        counters = self.counters
        self.progress_bar = TuneProgress(self.progress, self.options.trials, self.problem, self.evaluator)
        self.best_ms = min((self.problem.flops / v / 1e9 for v in self.known.values() if v), default=None)
        self.offered = self.space.knob_choices(self.problem, self.device)
        self.rescue_rng = random.Random(self.seed)
        try:
            while (counters.measured < self.options.trials and not (self._out_of_time() and not self._seed_next())
                   and counters.consecutive_failures < MAX_CONSECUTIVE_FAILURES):
                interrupts.check()  # a Ctrl-C whose KeyboardInterrupt was dropped (interrupts.py)
                if self.exchange is not None and self.exchange.due():
                    self._take_in(self.exchange.pull())
                    if self.helper and not self.sharing.keep_helping():
                        self.stopped = "the holder of the problem left this study"
                        break
                self._propose_candidates()
                if not self.pending:
                    break  # the sampler proposes nothing new
                if self.deadline is not None and counters.valid and not self._seed_next() and \
                        not self.evaluator.ready_within(self.pending[0].handle, self.deadline - time.perf_counter()):
                    # out of time before the next candidate compiled: it is not waited for (once one
                    # candidate is measured: a budget shorter than a compile still measures the first;
                    # and the seeds in flight, see _seed_next)
                    break
                measurement = self._measure_next()
                if measurement.ok and converged(counters.history, self.options.patience):
                    self.stopped = (f"converged: the last {self.options.patience} measured trials gained less "
                                    f"than {CONVERGED_GAIN:.1%} on the best")
                    break
        except KeyboardInterrupt:
            self.interrupted, self.stopped = True, "interrupted (Ctrl-C)"
        except FatalEvaluationError as exc:
            self.interrupted, self.stopped = True, str(exc)
        finally:
            self._cancel_in_flight()
            self.progress_bar.close()
            self.writer.close()
            if self.helper and self.owns_evaluator:
                self.evaluator.close()

    def _out_of_time(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def _seed_next(self) -> bool:
        """Whether the next candidate in flight is a seed (what serves now, the nearest winners, the wave
        model's best): the seeds compiling when the deadline comes are still measured. On a cold cubin
        cache they all compile at once in the first seconds, and a short budget (a campaign's 10 s) used to
        end with one of them measured and the rest cancelled; waiting costs at most that one compile."""
        return bool(self.pending) and self.pending[0].config.name in self.seed_names

    def _propose_candidates(self) -> None:
        """Asks the sampler for trials until `lookahead` candidates are in flight (or the budget,
        the deadline or MAX_IDLE_PROPOSALS says no more). A proposal that breaks a rule is pruned;
        one of a configuration measured, failed or in flight already is answered from that."""
        counters, problem, device = self.counters, self.problem, self.device
        while (len(self.pending) < self.lookahead and counters.measured + len(self.pending) < self.options.trials
               and not self._out_of_time() and counters.idle_proposals < MAX_IDLE_PROPOSALS):
            if counters.idle_proposals and counters.idle_proposals % RESCUE_AFTER == 0 and not self._rescue():
                break  # nothing left to propose
            trial = self.study.ask()
            if self.exchange is not None:
                self.exchange.tag(trial)
            config, broken = self.space.evaluate(ask_params(trial, self.space, self.offered), problem, device)
            reasons = [f"space: {rule}" for rule in broken] if config is None else config.check(problem, device)
            if reasons:
                trial.set_user_attr("rejected", reasons)
                self.writer.put(self.study.tell(trial, state=optuna.trial.TrialState.PRUNED))
                counters.rejected += 1
                counters.idle_proposals += 1
                continue
            trial.set_user_attr("config", config.name)
            if self._answer_repeat(trial, config):
                counters.duplicates += 1
                counters.idle_proposals += 1
                continue
            counters.idle_proposals = 0
            self.pending.append(InFlight(config, [trial], self.evaluator.start(config)))

    def _answer_repeat(self, trial: optuna.Trial, config) -> bool:
        """Whether `config` failed, was measured or is in flight already; if so, `trial` gets that
        answer (now, or with the candidate in flight) instead of a measurement of its own."""
        name = config.name
        if name in self.failed_before:
            trial.set_user_attr("duplicate", True)
            tell_trials(self.study, self.writer, [trial], self.failed_before[name])
            return True
        if name in self.known:  # measured before: answer from the study
            trial.set_user_attr("duplicate", True)
            self.writer.put(self.study.tell(trial, self.known[name]))
            return True
        waiting = next((candidate for candidate in self.pending if candidate.config.name == name), None)
        if waiting is not None:
            waiting.trials.append(trial)
            return True
        return False

    def _measure_next(self) -> Measurement:
        """Verifies and times the oldest candidate in flight, and counts what came of it."""
        counters = self.counters
        candidate = self.pending.popleft()
        config = candidate.config
        measurement = self.evaluator.finish(candidate.handle, self.best_ms)
        tell_trials(self.study, self.writer, candidate.trials, measurement)
        if measurement.ok:
            counters.valid += 1
            counters.consecutive_failures = 0
            self.known[config.name] = measurement.tflops
            counters.history.append(measurement.tflops)
            if self.best_ms is None or measurement.time_ms < self.best_ms:
                self.best_ms = measurement.time_ms
                # Kept as it is found: a killed tune still leaves its best verified kernel
                # (a helper's measurements go to the holder's study; the holder caches)
                if not self.helper:
                    self.records.keep(self.records.record(config, measurement, self.evaluator.cublas_ms,
                                                          counters.for_record(), provisional=True))
        else:
            counters.failed += 1
            counters.consecutive_failures += 1
            self.failed_before[config.name] = measurement
            counters.failures[measurement.kind] = counters.failures.get(measurement.kind, 0) + 1
        self.progress_bar.update(measurement.ok, self.best_ms, counters.rejected, counters.failed)
        return measurement

    def _rescue(self) -> bool:
        """Enqueues a few valid, unmeasured configurations drawn uniformly (see RESCUE_AFTER); whether it
        found any. After one that found none, it draws nothing and says so (the search is then done)."""
        if not self.rescues_left:
            return False
        found = 0
        for config, values in self.space.shuffled_draws(self.problem, self.device, self.rescue_rng, RESCUE_DRAWS):
            name = config.name
            if name in self.known or name in self.failed_before or name in self.rescued \
                    or any(candidate.config.name == name for candidate in self.pending):
                continue
            self.rescued.add(name)
            self.study.enqueue_trial(values)
            found += 1
            if found == RESCUE_CONFIGS:
                break
        self.rescues_left = found > 0
        if not found and not self.stopped:
            self.stopped = (f"no valid configuration of {self.space.path.name} left to measure (every one measured, "
                            f"failed or in flight, or none in {RESCUE_DRAWS} uniform draws)")
        return found > 0

    def _take_in(self, trials_elsewhere) -> None:
        """Other workers' trials of this study: measured there, never measured here again, and
        counted in this run's `trials` (the problem gets that many measurements, by any GPU)."""
        self.counters.measured_elsewhere += remember_trials(trials_elsewhere, self.known, self.failed_before)

    def _cancel_in_flight(self) -> None:
        """The candidates still in flight when the search stops: cancelled, their trials failed."""
        for candidate in self.pending:
            self.evaluator.cancel(candidate.handle)
            tell_trials(self.study, self.writer, candidate.trials,
                        Measurement.failure("cancelled", "tuning stopped before it was measured"))

    # ---- after the search --------------------------------------------------------------------------
    def _choose_winner(self) -> Winner:
        """The best finalist re-timed with cuBLAS; after Ctrl-C or a lost GPU, the best as it stands."""
        try:
            finalists = best_configs(self.study, self.space, FINALISTS)
            if not finalists:
                counters = self.counters
                # (a search the evaluator ended before any measurement, such as a measuring process that
                # could not start, has counted nothing: its reason is the only one there is)
                why = f"; the search stopped: {self.stopped}" if self.stopped else ""
                raise TuneError(
                    f"no configuration of {self.space.path.name} was measured for {self.problem} "
                    f"({counters.rejected} rejected, {counters.failed} failed: {counters.failures or 'none'}){why}"
                )
            if self.interrupted:
                return best_so_far(finalists, self.known, self.problem, self.evaluator)
            return retimed_best(finalists, self.evaluator)
        finally:
            if self.owns_evaluator:
                self.evaluator.close()

    def _result(self, winner: Winner) -> TuneResult:
        """Caches the winner (or cuBLAS, where the winner does not beat it by more than the noise)
        and returns the tune's result."""
        counters, latency = self.counters, winner.latency
        wall = time.perf_counter() - self.started
        study_trials = sum(1 for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                           if "config" in t.user_attrs and not t.user_attrs.get("duplicate"))
        # an interrupted tune's best stays provisional: served, and replaced by the next finished tune
        record = self.records.record(winner.config, winner.measurement, winner.cublas_ms, counters.for_record(),
                                     provisional=self.interrupted, latency=latency, sustained=winner.sustained,
                                     baselines=winner.baselines)
        rel_error = record.rel_error  # the best generated kernel's, whichever is kept
        kept_cublas = keeps_cublas(record.ratio, winner.noise, latency, winner.gpu_bound)
        if kept_cublas:  # within the noise of cuBLAS or slower: cuBLAS is the winner, with its figures
            record = cublas_record(record, latency.ratio if latency else None)
        record.trials["in_study"] = study_trials
        if self.exchange is not None:
            record.trials["other_gpus"] = self.exchange.pulled  # trials helpers measured into this study
        record.wall_s = wall
        cache_path = self.records.keep(record)
        evaluator, chosen, errors = self.evaluator, winner.measurement, self.records.errors
        return TuneResult(
            problem=self.problem, device=self.device, config=winner.config, time_ms=chosen.time_ms,
            tflops=chosen.tflops, rel_error=rel_error, cublas_ms=winner.cublas_ms, valid=counters.valid,
            rejected=counters.rejected, failed=counters.failed, duplicates=counters.duplicates,
            study_trials=study_trials, wall_s=wall, study_name=self.name, storage=self.storage,
            cache_path=str(cache_path) if cache_path else None, interrupted=self.interrupted,
            history=counters.history, failures=counters.failures, stopped=self.stopped,
            restarts=evaluator.restarts, restart_s=evaluator.restart_s, cache_error=errors[-1] if errors else "",
            unstored_kernels=evaluator.unstored, storage_error=evaluator.storage_error,
            kept_cublas=kept_cublas, noise=winner.noise, seeded=counters.seeded, latency=latency,
            sustained=dict(winner.sustained),
        )
