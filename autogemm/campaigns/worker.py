"""A campaign's worker process, one per GPU: it claims problems from the board (`claims.py`) and
tunes each with the usual tuner, renewing its claim's heartbeat meanwhile; with nothing left to
claim it helps a live holder search its study (several GPUs on one study: `study.TrialExchange`).
`campaign.run_campaign` starts the workers and shows their events (`events.WorkerEvent`).
"""

from __future__ import annotations

import logging
import dataclasses
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from .. import interrupts
from ..gpu import launch
from ..results.cache import TuningCache
from .file import Campaign
from .claims import ClaimBoard, ClaimState, new_owner
from ..kernels.compile import share_compile_pool
from ..kernels.compile_service import RemoteCompilePool
from .events import WorkerEvent
from ..measure.isolate import keep_measuring_processes
from ..measure.measuring_process import detach
from ..problem import Problem
from ..results.provenance import host
from ..kernels.space import SearchSpace, candidate_space_names
from ..tuning.result import TuneError, TuneRunning, TuneStorageError
from ..results.url_secrets import hide_passwords

log: logging.Logger = logging.getLogger(__name__)
HEARTBEAT_FRACTION = 0.25  # a worker renews its claim every grace * this seconds
# A worker with nothing to claim or help looks again after this long (a holder's heartbeat may go
# late meanwhile), or sooner, once the problems held by others change (CHANGE_POLL_S apart)
IDLE_WAIT_S = 5.0
CHANGE_POLL_S = 0.5


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process needs (pickled to it): its campaign, where to store, its GPU."""

    campaign: Campaign
    storage: str
    label: str  # how the progress view names it ("GPU0", ...)
    visible_devices: str | None  # CUDA_VISIBLE_DEVICES for the worker; None: leave it
    jobs: int  # compile workers
    # tests and replays: a picklable callable, problem -> Evaluator, with a `device` attribute;
    # and a search space to use instead of each problem's candidate spaces
    evaluator_factory: object = None
    space: str | None = None
    stop_at: float | None = None  # time.time() after which no new problem is claimed
    share_compiles: bool = False  # compile in the campaign's one pool (compile_service.py), `jobs` its size
    compile_conn: object = None  # the worker's end of the pipe to that pool (set by run_campaign)


def worker_main(spec: WorkerSpec, events: Any) -> None:
    """Body of a worker process: claim, tune, record, until no problem is left."""
    # SIGINT means stop, even where this process inherited it ignored (started in the background by
    # a shell without job control, which ignores SIGINT for its background commands); remembered, so
    # that a stop raised inside a garbage collector's callback (and dropped there) still stops
    interrupts.install()
    if spec.visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.visible_devices  # before anything touches CUDA
    # A group of its own: a Ctrl-C at the terminal reaches the parent alone, which passes one on to
    # each worker (two at once could break a tune's orderly stop); and it dies with the parent.
    detach(os.getppid())
    # One measuring process serves every tune of this worker, started first: its interpreter and
    # CUDA context come up while this process imports the tuner, registers and claims its first
    # problem. (The worker sees its one GPU as ordinal 0.)
    with keep_measuring_processes(prestart_on=0 if spec.evaluator_factory is None else None):
        _claim_and_tune(spec, events)


def _claim_and_tune(spec: WorkerSpec, events) -> None:
    """`worker_main` once its process is set up."""
    from ..tuning.study import Sharing  # (lazy: Optuna)

    if spec.compile_conn is not None:
        share_compile_pool(RemoteCompilePool(spec.compile_conn))
    campaign, factory = spec.campaign, spec.evaluator_factory
    board = None
    owner = new_owner()
    try:
        board = ClaimBoard(spec.storage)  # (a storage that cannot be used is reported as the worker's error)
        if factory is not None:
            device = factory.device
        else:
            device = launch.current_device()
        board.register(campaign.name, device.slug, [p.key for p in campaign.problems])
        events.put((WorkerEvent.READY, spec.label, device.name, owner))
        # the tunes read the shipped results too (their winners seed the search); only the
        # campaign's own cache says what is done
        cache = TuningCache(campaign.cache_dir) if campaign.cache_dir else TuningCache()
        own = TuningCache(cache.directory, shipped=False)
        skipped: set[str] = set()
        helped: set[str] = set()  # studies this worker has helped (not joined twice)
        while spec.stop_at is None or time.time() < spec.stop_at:
            interrupts.check()  # no new problem after a Ctrl-C, even one whose first raise was dropped
            left = {p.key for p in campaign.problems} - skipped
            key = board.claim(campaign.name, device.slug, owner, campaign.grace, only=left)
            if key is None:
                # nothing to take; while other workers (or hosts) still hold problems, help one of
                # them (search its study too), or wait: a holder that dies leaves its problem to be
                # taken over once its heartbeat is late
                def read_held(left=left):  # (a row in a state this version does not know is nobody's)
                    return [c for c in board.claims(campaign.name, device.slug)
                            if c.state == ClaimState.CLAIMED and c.problem in left]

                held = read_held()
                if not held:
                    break
                if _help_one(spec, board, device, owner, cache, helped, events):
                    return
                _wait_for_a_change(read_held, held, min(IDLE_WAIT_S, campaign.grace * HEARTBEAT_FRACTION))
                continue
            problem = Problem.from_key(key)
            found = own.lookup(problem, device.slug)
            if found is not None and not found[0].provisional:
                # tuned before (an earlier run of the campaign whose storage is gone, a shipped
                # cache being extended): done with the record's figures, not tuned again
                summary = _record_summary(found[0], found[1])
                board.finish(campaign.name, device.slug, key, owner, summary)
                events.put((WorkerEvent.DONE, spec.label, key, summary))
                continue
            events.put((WorkerEvent.START, spec.label, key))
            beat = _Heartbeat(board, campaign, device.slug, key, owner)

            def announce(study, key=key):  # which study helpers may join now
                try:
                    board.announce(campaign.name, device.slug, key, owner, study)
                except Exception as exc:  # the database away for a moment: the tune goes on unhelped
                    log.warning("autogemm campaign: could not announce study (%s)", type(exc).__name__)

            try:
                result = _campaign_tune(spec, problem, cache, events, Sharing(announce=announce), space=spec.space)
            except KeyboardInterrupt:
                board.release(campaign.name, device.slug, key, owner)
                events.put((WorkerEvent.STOPPED, spec.label, key, "interrupted"))
                return
            except (TuneRunning, TuneStorageError) as exc:
                # a tune outside the campaign runs this study here, or the study storage failed (a
                # database away for a moment, say): nothing wrong with the problem, which goes back
                # for another worker or a rerun; this worker leaves it
                board.release(campaign.name, device.slug, key, owner)
                skipped.add(key)
                events.put((WorkerEvent.SKIPPED, spec.label, key, hide_passwords(str(exc), spec.storage)))
                continue
            except TuneError as exc:  # nothing measurable: done, with the reason (not retried forever)
                reason = hide_passwords(str(exc), spec.storage)[:1000]
                board.finish(campaign.name, device.slug, key, owner, {"error": reason, "host": host()})
                events.put((WorkerEvent.FAILED, spec.label, key, reason))
                continue
            finally:
                beat.stop()
            if result.interrupted:  # Ctrl-C or a lost GPU: the best so far is cached; the claim goes back
                board.release(campaign.name, device.slug, key, owner)
                events.put((WorkerEvent.STOPPED, spec.label, key, result.stopped))
                return
            summary = {**result.to_json(), "host": host(), "kept_cublas": result.kept_cublas}
            summary.pop("storage", None)  # the board keeps no storage URL (everyone reading it knows it)
            cached = own.lookup(problem, device.slug)
            if cached is not None:  # the board keeps the record too: `campaign export` rebuilds the cache from it
                summary["record"] = cached[0].to_json()
            if board.finish(campaign.name, device.slug, key, owner, summary):
                events.put((WorkerEvent.DONE, spec.label, key, summary))
            else:
                events.put((WorkerEvent.LOST, spec.label, key,
                            "the claim was taken over (heartbeat late); the result is cached"))
    except KeyboardInterrupt:
        events.put((WorkerEvent.STOPPED, spec.label, "", "interrupted"))
    except Exception as exc:  # report it to the parent, which says which GPU failed
        events.put((WorkerEvent.ERROR, spec.label, hide_passwords(f"{type(exc).__name__}: {exc}", spec.storage)))
        raise
    finally:
        if board is not None:
            board.close()


def _wait_for_a_change(read_held, held: list[Any], timeout: float) -> None:
    """Sleeps up to `timeout` seconds, less once a problem held by another worker is done, given
    back, taken over or announces a study to help with (`read_held()` reads them again): the last
    GPU to finish does not keep the campaign waiting out a whole pause. A heartbeat is no change."""
    def state(claims) -> set[Any]:
        return {(c.problem, c.state, c.owner, c.study) for c in claims}

    before = state(held)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(max(0.0, min(CHANGE_POLL_S, deadline - time.monotonic())))
        try:
            if state(read_held()) != before:
                return
        except Exception:  # the database away for a moment: wait out the pause
            continue


def _help_one(spec: WorkerSpec, board: ClaimBoard, device, owner: str, cache, helped: set[Any], events) -> bool:
    """Searches, beside its holder, the study of a problem another live worker is tuning (the first
    one this worker has not helped yet), until the holder leaves that study. Returns True if the
    worker was interrupted (Ctrl-C) and must stop; False otherwise (helped, or nothing to help)."""
    from ..tuning.study import Sharing, study_name_for  # (lazy: Optuna)

    campaign = spec.campaign
    for claim in board.helpable(campaign.name, device.slug, campaign.grace, owner):
        if claim.study in helped:
            continue
        helped.add(claim.study)
        # the study's name comes from the database: joined only if it is exactly the name this
        # worker gives that problem's study in one of its spaces (the same template version too)
        problem = Problem.from_key(claim.problem)
        names = [spec.space] if spec.space else candidate_space_names(problem, device)
        space = next((n for n in names if study_name_for(problem, device, SearchSpace.load(n)) == claim.study), None)
        if space is None:
            continue

        def keep_helping(claim=claim) -> bool:
            try:
                return any(c.problem == claim.problem and c.study == claim.study
                           for c in board.helpable(campaign.name, device.slug, campaign.grace, owner))
            except Exception:  # the database away: stop helping rather than search blind
                return False

        events.put((WorkerEvent.HELPING, spec.label, claim.problem, claim.study))
        try:
            _campaign_tune(spec, problem, cache, events, Sharing(keep_helping=keep_helping), space=space,
                           study_name=claim.study)
        except KeyboardInterrupt:
            events.put((WorkerEvent.STOPPED, spec.label, claim.problem, "interrupted while helping"))
            return True
        except TuneError as exc:  # this worker could not search it: the holder goes on alone
            events.put((WorkerEvent.SKIPPED, spec.label, claim.problem,
                        hide_passwords(f"helping: {exc}", spec.storage)))
        return False
    return False


def _campaign_tune(spec: WorkerSpec, problem: Problem, cache, events, sharing, **where):
    """`tune` with the campaign's options (budget and seed), this worker's storage, compile jobs and
    evaluator, its progress as events; `where`: the space (and, for a helper, the study)."""
    from ..tuning.tuner import tune  # (lazy: Optuna)

    key = problem.key
    options = dataclasses.replace(spec.campaign.tune_options, storage=spec.storage, jobs=spec.jobs, **where)
    return tune(problem, options, cache=cache, sharing=sharing,
                evaluator=spec.evaluator_factory(problem) if spec.evaluator_factory is not None else None,
                progress=lambda n, tflops, ratio: events.put((WorkerEvent.TRIAL, spec.label, key, n, tflops, ratio)))


def _record_summary(record, source: str) -> dict[str, Any]:
    return {"problem": record.problem, "device": record.device, "config": record.config_name,
            "tflops": record.tflops, "cublas_tflops": record.cublas_tflops, "ratio": record.ratio,
            "kept_cublas": record.is_cublas, "host": record.host, "from_cache": source, "record": record.to_json()}


class _Heartbeat:
    """Renews a claim from a background thread while its problem is tuned."""

    def __init__(self, board: ClaimBoard, campaign: Campaign, device: str, key: str, owner: str):
        self.stopping = threading.Event()

        def run() -> None:
            # (a renewal refused means another worker took the problem over: this one learns it when
            # board.finish refuses its result, which it still caches)
            while not self.stopping.wait(campaign.grace * HEARTBEAT_FRACTION):
                try:
                    board.heartbeat(campaign.name, device, key, owner)
                except Exception as exc:  # the database away for a moment: try again next beat
                    log.warning("autogemm campaign: heartbeat failed (%s); retrying", type(exc).__name__)

        self.thread = threading.Thread(target=run, name="autogemm-claim-heartbeat", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
