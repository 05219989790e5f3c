"""Campaigns: every problem of a campaign file tuned once per device model, over every GPU of this
host and over every host pointed at the same storage.

`run_campaign` starts one worker process per GPU (a fresh interpreter, so no CUDA context is
inherited; `CUDA_VISIBLE_DEVICES` pins it to its GPU by UUID before CUDA is touched). Each worker
takes problems from the claim board (`claims.py`) until none is left: it tunes one with the usual
tuner (its own measuring process; its kernels compiled in the one pool of the host's cores that
the parent keeps for every worker, `compile_service.py`), writes the winner
to the cache as it is found and marks the problem done with the result. The parent shows a line
per GPU and ends with a table of every result on the board, other hosts' included.

What a stop costs: Ctrl-C (or SIGINT to the parent) is passed on to every worker, whose tune keeps its best verified kernel and gives
its claim back; a killed worker's claim is taken over after the campaign's grace period (at once
by a worker of the same host); its studies keep every finished trial (they are written as they
finish, never left RUNNING), so the next worker resumes from them. Running the command again
continues where it stopped; a problem whose result is already in the campaign's cache (finished,
current) is marked done from it without tuning, so a campaign also continues from its cache
documents alone, on a fresh machine whose storage is empty.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass

from .campaign_file import Campaign
from .claims import DONE, ClaimBoard, new_owner
from .compile_service import CompileService
from .problem import Problem
from .provenance import host

HEARTBEAT_FRACTION = 0.25  # a worker renews its claim every grace * this seconds


class CampaignError(RuntimeError):
    pass


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str  # GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as CUDA_VISIBLE_DEVICES takes it
    name: str


def list_gpus() -> list[Gpu]:
    """The GPUs of this host, from the CUDA driver (no context is created)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        raise CampaignError("listing GPUs needs the cuda-bindings package: pip install 'autogemm[cuda13]' "
                            "(or [cuda12])") from None

    def check(result):
        error, *values = result
        if error != driver.CUresult.CUDA_SUCCESS:
            raise CampaignError(f"the CUDA driver cannot list GPUs: {error.name}")
        return values[0] if len(values) == 1 else values

    try:
        check(driver.cuInit(0))
        gpus = []
        for index in range(check(driver.cuDeviceGetCount())):
            device = check(driver.cuDeviceGet(index))
            name = check(driver.cuDeviceGetName(128, device)).split(b"\0")[0].decode(errors="replace")
            raw = bytes(check(driver.cuDeviceGetUuid(device)).bytes).hex()
            uuid = f"GPU-{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:32]}"
            gpus.append(Gpu(index, uuid, name))
    except CampaignError:
        raise
    except Exception as exc:  # no driver library at all (a machine without a GPU), or a broken one
        raise CampaignError(f"no CUDA driver usable on this host ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); a campaign runs on GPUs") from None
    return gpus


def select_gpus(devices, gpus: list[Gpu]) -> list[Gpu]:
    """The campaign's GPUs among this host's: all, or those named by index or UUID."""
    if devices == "all":
        if not gpus:
            raise CampaignError("this host has no CUDA GPU")
        return gpus
    chosen = []
    for wanted in devices:
        match = [g for g in gpus if (g.index == wanted if isinstance(wanted, int) else g.uuid.lower() == wanted.lower())]
        if not match:
            raise CampaignError(f"campaign.devices names GPU {wanted!r}, which this host does not have "
                                f"(it has {', '.join(f'{g.index} {g.uuid}' for g in gpus) or 'none'})")
        chosen.append(match[0])
    return chosen


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


def worker_main(spec: WorkerSpec, events) -> None:
    """Body of a worker process: claim, tune, record, until no problem is left."""
    # SIGINT means stop, even where this process inherited it ignored (started in the background by
    # a shell without job control, which ignores SIGINT for its background commands)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if spec.visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.visible_devices  # before anything touches CUDA
    # A group of its own: a Ctrl-C at the terminal reaches the parent alone, which passes one on to
    # each worker (two at once could break a tune's orderly stop); and it dies with the parent.
    from .isolate import detach

    detach(os.getppid())
    from .cache import TuningCache
    from .study import Sharing
    from .tuner import TuneError, TuneRunning, tune

    if spec.compile_conn is not None:
        from .compile import share_compile_pool
        from .compile_service import RemoteCompilePool

        share_compile_pool(RemoteCompilePool(spec.compile_conn))
    campaign, factory = spec.campaign, spec.evaluator_factory
    board = ClaimBoard(spec.storage)
    owner = new_owner()
    try:
        if factory is not None:
            device = factory.device
        else:
            from .launch import current_device
            device = current_device()
        board.register(campaign.name, device.slug, [p.key for p in campaign.problems])
        events.put(("ready", spec.label, device.name, owner))
        # the tunes read the shipped results too (their winners seed the search); only the
        # campaign's own cache says what is done
        cache = TuningCache(campaign.cache_dir) if campaign.cache_dir else TuningCache()
        own = TuningCache(cache.directory, shipped=False)
        skipped: set[str] = set()
        helped: set[str] = set()  # studies this worker has helped (not joined twice)
        while spec.stop_at is None or time.time() < spec.stop_at:
            left = {p.key for p in campaign.problems} - skipped
            key = board.claim(campaign.name, device.slug, owner, campaign.grace, only=left)
            if key is None:
                # nothing to take; while other workers (or hosts) still hold problems, help one of
                # them (search its study too), or wait: a holder that dies leaves its problem to be
                # taken over once its heartbeat is late
                held = [c for c in board.claims(campaign.name, device.slug) if c.state != DONE and c.problem in left]
                if not held:
                    break
                if _help_one(spec, board, device, owner, cache, helped, events):
                    return
                time.sleep(min(5.0, campaign.grace * HEARTBEAT_FRACTION))
                continue
            problem = Problem.from_key(key)
            found = own.lookup(problem, device.slug)
            if found is not None and not found[0].provisional:
                # tuned before (an earlier run of the campaign whose storage is gone, a shipped
                # cache being extended): done with the record's figures, not tuned again
                summary = _record_summary(found[0], found[1])
                board.finish(campaign.name, device.slug, key, owner, summary)
                events.put(("done", spec.label, key, summary))
                continue
            events.put(("start", spec.label, key))
            beat = _Heartbeat(board, campaign, device.slug, key, owner)

            def announce(study, key=key):  # which study helpers may join now
                try:
                    board.announce(campaign.name, device.slug, key, owner, study)
                except Exception as exc:  # the database away for a moment: the tune goes on unhelped
                    print(f"autogemm campaign: could not announce study ({type(exc).__name__})", file=sys.stderr)

            try:
                result = tune(problem, trials=campaign.trials, timeout=campaign.timeout,
                              seed=campaign.seed, storage=spec.storage, cache=cache, jobs=spec.jobs, space=spec.space,
                              evaluator=factory(problem) if factory is not None else None,
                              patience=campaign.patience, sharing=Sharing(announce=announce),
                              progress=lambda n, tflops, ratio: events.put(("trial", spec.label, key, n, tflops, ratio)))
            except KeyboardInterrupt:
                board.release(campaign.name, device.slug, key, owner)
                events.put(("stopped", spec.label, key, "interrupted"))
                return
            except TuneRunning as exc:  # a tune outside the campaign runs this study here: leave it to it
                board.release(campaign.name, device.slug, key, owner)
                skipped.add(key)
                events.put(("skipped", spec.label, key, str(exc)))
                continue
            except TuneError as exc:  # nothing measurable: done, with the reason (not retried forever)
                board.finish(campaign.name, device.slug, key, owner, {"error": str(exc)[:1000], "host": host()})
                events.put(("failed", spec.label, key, str(exc)))
                continue
            finally:
                beat.stop()
            if result.interrupted:  # Ctrl-C or a lost GPU: the best so far is cached; the claim goes back
                board.release(campaign.name, device.slug, key, owner)
                events.put(("stopped", spec.label, key, result.stopped))
                return
            summary = {**result.to_json(), "host": host(), "kept_cublas": result.kept_cublas}
            cached = own.lookup(problem, device.slug)
            if cached is not None:  # the board keeps the record too: `campaign export` rebuilds the cache from it
                summary["record"] = cached[0].to_json()
            if board.finish(campaign.name, device.slug, key, owner, summary):
                events.put(("done", spec.label, key, summary))
            else:
                events.put(("lost", spec.label, key, "the claim was taken over (heartbeat late); the result is cached"))
    except KeyboardInterrupt:
        events.put(("stopped", spec.label, "", "interrupted"))
    except Exception as exc:  # report it to the parent, which says which GPU failed
        events.put(("error", spec.label, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        board.close()


def _help_one(spec: WorkerSpec, board: ClaimBoard, device, owner: str, cache, helped: set, events) -> bool:
    """Searches, beside its holder, the study of a problem another live worker is tuning (the first
    one this worker has not helped yet), until the holder leaves that study. Returns True if the
    worker was interrupted (Ctrl-C) and must stop; False otherwise (helped, or nothing to help)."""
    from .space import SearchSpace, candidate_space_names
    from .study import Sharing, study_name_for
    from .tuner import TuneError, tune

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

        events.put(("helping", spec.label, claim.problem, claim.study))
        try:
            tune(problem, trials=campaign.trials, timeout=campaign.timeout, seed=campaign.seed, storage=spec.storage,
                 cache=cache, jobs=spec.jobs, space=space, study_name=claim.study, patience=campaign.patience,
                 evaluator=spec.evaluator_factory(problem) if spec.evaluator_factory is not None else None,
                 sharing=Sharing(keep_helping=keep_helping),
                 progress=lambda n, tflops, ratio: events.put(("trial", spec.label, claim.problem, n, tflops, ratio)))
        except KeyboardInterrupt:
            events.put(("stopped", spec.label, claim.problem, "interrupted while helping"))
            return True
        except TuneError as exc:  # this worker could not search it: the holder goes on alone
            events.put(("skipped", spec.label, claim.problem, f"helping: {exc}"))
        return False
    return False


def _record_summary(record, source: str) -> dict:
    return {"problem": record.problem, "device": record.device, "config": record.config_name,
            "tflops": record.tflops, "cublas_tflops": record.cublas_tflops, "ratio": record.ratio,
            "kept_cublas": record.is_cublas, "host": record.host, "from_cache": source, "record": record.to_json()}


def board_records(board: ClaimBoard, campaign: Campaign) -> dict[str, dict]:
    """The cache records the campaign's workers left on the board, every host's, as device
    documents' entries ({device slug: {problem key: record JSON}}), each checked as the cache
    checks what it reads (a bad one is skipped with a warning)."""
    import warnings

    from .cache import FORMAT, CacheWarning, check_slug, valid_records

    entries: dict[str, dict] = {}
    for claim in board.claims(campaign.name):
        if claim.state == DONE and claim.result and isinstance(claim.result.get("record"), dict):
            try:
                check_slug(claim.device)  # (it becomes a file name where the export is imported)
            except ValueError as exc:
                warnings.warn(f"campaign {campaign.name}: skipped the records of {exc}", CacheWarning, stacklevel=2)
                continue
            entries.setdefault(claim.device, {})[claim.problem] = claim.result["record"]
    return {slug: {key: record.to_json() for key, record in
                   valid_records({"format": FORMAT, "device": slug, "entries": found}, f"campaign {campaign.name}").items()}
            for slug, found in entries.items()}


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
                    print(f"autogemm campaign: heartbeat failed ({type(exc).__name__}); retrying", file=sys.stderr)

        self.thread = threading.Thread(target=run, name="autogemm-claim-heartbeat", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()


def worker_specs(campaign: Campaign, storage: str, gpus: list[Gpu], cores: int,
                 stop_at: float | None = None) -> list[WorkerSpec]:
    """One worker per GPU, all compiling in one pool of `cores` processes."""
    return [WorkerSpec(campaign, storage, f"GPU{g.index}", g.uuid, cores, stop_at=stop_at, share_compiles=True)
            for g in gpus]


def run_campaign(campaign: Campaign, specs: list[WorkerSpec], view=None) -> dict:
    """Runs the workers to the end (or Ctrl-C); returns {label: exit code}. `view` (CampaignView)
    gets every worker event."""
    context = multiprocessing.get_context("spawn")
    events = context.Queue()
    processes = {}
    # SIGINT stops the campaign even where it was inherited ignored (a background command of a
    # shell without job control): the parent passes it on to the workers in order
    main_thread = threading.current_thread() is threading.main_thread()
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler) if main_thread else None
    sharing = [spec for spec in specs if spec.share_compiles]
    service = CompileService(max(spec.jobs for spec in sharing)) if sharing else None
    specs = [dataclasses.replace(spec, compile_conn=service.connect()) if spec.share_compiles else spec
             for spec in specs]
    for spec in specs:
        process = context.Process(target=worker_main, args=(spec, events), name=f"autogemm-campaign-{spec.label}")
        process.start()
        processes[spec.label] = process
    interrupted = False
    try:
        while any(p.is_alive() for p in processes.values()):
            _drain(events, view, timeout=0.5)
    except KeyboardInterrupt:  # pass it on: each worker keeps its best so far and puts its claim back
        interrupted = True
        first = time.monotonic()

        def again(signum, frame):  # a second Ctrl-C stops at once; one within a second is the same one
            if time.monotonic() - first > 1.0:  # (`timeout` sends it to the child and to its group)
                raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, again)
        print("autogemm campaign: stopping; each worker keeps its best so far and gives its problem back "
              "(Ctrl-C again to stop at once)", file=sys.stderr, flush=True)
        for process in processes.values():
            if process.is_alive():
                os.kill(process.pid, signal.SIGINT)
        deadline = time.monotonic() + 60
        while any(p.is_alive() for p in processes.values()) and time.monotonic() < deadline:
            try:
                _drain(events, view, timeout=0.5)
            except KeyboardInterrupt:  # a second Ctrl-C: stop now (claims come back after the grace period)
                break
        signal.signal(signal.SIGINT, previous)
    finally:
        for process in processes.values():
            if process.is_alive():
                process.terminate()
            process.join()
        _drain(events, view, timeout=0)
        if service is not None:
            service.close()
        if main_thread:
            signal.signal(signal.SIGINT, inherited)
    codes = {label: p.exitcode for label, p in processes.items()}
    if interrupted:
        raise KeyboardInterrupt
    return codes


def _drain(events, view, timeout: float) -> None:
    try:
        event = events.get(timeout=timeout) if timeout else events.get_nowait()
    except queue.Empty:
        if view is not None:
            view.tick()
        return
    while True:
        if view is not None:
            view.event(event)
        try:
            event = events.get_nowait()
        except queue.Empty:
            return


def board_summary(board: ClaimBoard, campaign: Campaign) -> list[dict]:
    """Every problem of the campaign on the board, per device model: its state and result."""
    rows = []
    for claim in board.claims(campaign.name):
        result = claim.result or {}
        rows.append({"device": claim.device, "problem": claim.problem, "state": claim.state,
                     "attempts": claim.attempts, "host": result.get("host", ""),
                     "config": result.get("config", ""), "tflops": result.get("tflops"),
                     "cublas_tflops": result.get("cublas_tflops"), "ratio": result.get("ratio"),
                     "kept_cublas": result.get("kept_cublas"), "error": result.get("error", ""),
                     "done": claim.state == DONE})
    return rows


def resolve_storage(campaign: Campaign) -> str:
    from .study import default_storage

    return campaign.storage or default_storage()
