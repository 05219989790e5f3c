"""Campaigns: every problem of a campaign file tuned once per device model, over every GPU of this
host and over every host pointed at the same storage.

`run_campaign` starts one worker process per GPU (`campaigns/worker.py`: a fresh interpreter, so no
CUDA context is inherited; `CUDA_VISIBLE_DEVICES` pins it to its GPU by UUID before CUDA is
touched). Each worker takes problems from the claim board (`claims.py`) until none is left: it
tunes one with the usual tuner (its own measuring process; its kernels compiled in the one pool of
the host's cores that the parent keeps for every worker, `compile_service.py`), writes the winner
to the cache as it is found and marks the problem done with the result; with nothing left to claim
it helps another GPU's tune. The parent shows a line per GPU and ends with a table of every result
on the board, other hosts' included.

What a stop costs: Ctrl-C (or SIGINT to the parent) is passed on to every worker, whose tune
keeps its best verified kernel and gives its claim back; a killed worker's claim is taken over after the campaign's grace period (at once
by a worker of the same host); its studies keep every finished trial (they are written as they
finish, never left RUNNING), so the next worker resumes from them. Running the command again
continues where it stopped; a problem whose result is already in the campaign's cache (finished,
current) is marked done from it without tuning, so a campaign also continues from its cache
documents alone, on a fresh machine whose storage is empty.
"""

from __future__ import annotations

import logging
import dataclasses
import math
import multiprocessing
import os
import queue
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

from ..gpu.runtime import no_gpu
from ..results.cache import FORMAT, CacheWarning, check_slug, is_slug, valid_records
from .file import Campaign
from .worker import WorkerSpec, worker_main
from .claims import ClaimState, HostNameError, host_name
from ..kernels.compile_service import CompileService

log: logging.Logger = logging.getLogger(__name__)


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
        from cuda.bindings import driver  # (lazy: cuda-bindings)
    except ImportError:
        raise CampaignError("listing GPUs needs the cuda-bindings package: pip install 'autogemm[cuda13]' "
                            "(or [cuda12])") from None

    def check(result):
        error, *values = result
        if error != driver.CUresult.CUDA_SUCCESS:
            raise no_gpu(f"the CUDA driver cannot list GPUs: {error.name}")
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
        if type(exc).__name__ == "DynamicLibNotFoundError":
            raise no_gpu("no CUDA driver is installed") from None
        raise no_gpu(f"the CUDA driver cannot be used: {type(exc).__name__}: "
                     f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
    return gpus


def select_gpus(devices: Any, gpus: list[Gpu]) -> list[Gpu]:
    """The campaign's GPUs among this host's: all, or those named by index or UUID."""
    if devices == "all":
        if not gpus:
            raise no_gpu("the CUDA driver sees no device")
        return gpus
    chosen = []
    for wanted in devices:
        match = [g for g in gpus if (g.index == wanted if isinstance(wanted, int) else g.uuid.lower() == wanted.lower())]
        if not match:
            raise CampaignError(f"campaign.devices names GPU {wanted!r}, which this host does not have "
                                f"(it has {', '.join(f'{g.index} {g.uuid}' for g in gpus) or 'none'})")
        chosen.append(match[0])
    return chosen


def board_records(board: Any, campaign: Campaign) -> dict[str, dict[str, Any]]:
    """The cache records the campaign's workers left on the board (a ClaimBoard or BoardReader),
    every host's, as device documents' entries ({device slug: {problem key: record JSON}}), each
    checked as the cache checks what it reads (a bad one is skipped with a warning)."""
    entries: dict[str, dict[str, Any]] = {}
    for claim in board.claims(campaign.name):
        if claim.state == ClaimState.DONE and claim.result and isinstance(claim.result.get("record"), dict):
            try:
                check_slug(claim.device)  # (it becomes a file name where the export is imported)
            except ValueError as exc:
                warnings.warn(f"campaign {campaign.name}: skipped the records of {exc}", CacheWarning, stacklevel=2)
                continue
            entries.setdefault(claim.device, {})[claim.problem] = claim.result["record"]
    return {slug: {key: record.to_json() for key, record in
                   valid_records({"format": FORMAT, "device": slug, "entries": found}, f"campaign {campaign.name}").items()}
            for slug, found in entries.items()}


def worker_specs(campaign: Campaign, storage: str, gpus: list[Gpu], cores: int,
                 stop_at: float | None = None) -> list[WorkerSpec]:
    """One worker per GPU, all compiling in one pool of `cores` processes."""
    return [WorkerSpec(campaign, storage, f"GPU{g.index}", g.uuid, cores, stop_at=stop_at, share_compiles=True)
            for g in gpus]


def run_campaign(campaign: Campaign, specs: list[WorkerSpec], view: Any = None) -> dict[str, Any]:
    """Runs the workers to the end (or Ctrl-C); returns {label: exit code}. `view` (CampaignView)
    gets every worker event."""
    try:  # a host name claims cannot carry stops the run here, not in every worker
        host_name()
    except HostNameError as exc:
        raise CampaignError(str(exc)) from None
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
        log.warning("autogemm campaign: stopping; each worker keeps its best so far and gives its problem back "
                    "(Ctrl-C again to stop at once)")
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


def _text(value) -> str:
    """A stored text as a table shows it (a board row may hold anything: another version's, a hand's)."""
    return "" if value is None else value[:1000] if isinstance(value, str) else str(value)[:1000]


def _figure(value) -> float | None:
    return float(value) if type(value) in (int, float) and math.isfinite(value) else None


def _row(device: str, problem: str, state: str, attempts, result: dict[str, Any], done: bool) -> dict[str, Any]:
    return {"device": _text(device), "problem": _text(problem), "state": _text(state),
            "attempts": attempts if type(attempts) is int else 0, "host": _text(result.get("host")),
            "config": _text(result.get("config")), "tflops": _figure(result.get("tflops")),
            "cublas_tflops": _figure(result.get("cublas_tflops")), "ratio": _figure(result.get("ratio")),
            "kept_cublas": result.get("kept_cublas") is True, "error": _text(result.get("error")), "done": done}


def board_summary(board: Any, campaign: Campaign, cache: Any = None) -> list[dict[str, Any]]:
    """Every problem of the campaign on the board (a ClaimBoard or BoardReader), per device model:
    its state and result, each value checked (a row may hold anything). With `cache` (the
    campaign's own, TuningCache), a problem finished there counts as done, as a worker would take
    it, on the board or not: for the device models of the board and of the cache."""
    wanted = {p.key for p in campaign.problems}
    rows = {(c.device, c.problem): _row(c.device, c.problem, c.state, c.attempts, c.result or {},
                                        c.state == ClaimState.DONE)
            for c in board.claims(campaign.name) if c.problem in wanted}
    if cache is not None:
        for slug in sorted({device for device, _ in rows} | set(cache.devices(include_shipped=False))):
            if not is_slug(slug):
                continue
            finished = {r.problem: r for _, r in cache.records(slug, include_shipped=False)
                        if not r.stale and not r.provisional}  # (what `TuningCache.lookup` would serve)
            for problem in campaign.problems:
                row, record = rows.get((slug, problem.key)), finished.get(problem.key)
                if record is not None and not (row is not None and row["done"]):
                    rows[(slug, problem.key)] = _row(slug, problem.key, "done (cached)", row["attempts"] if row else 0, {
                        "host": record.host, "config": record.config_name, "tflops": record.tflops,
                        "cublas_tflops": record.cublas_tflops, "ratio": record.ratio,
                        "kept_cublas": record.is_cublas}, True)
    order = {p.key: i for i, p in enumerate(campaign.problems)}
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0], order[k[1]]))]


def progress_lines(campaign: Campaign, rows: list[dict[str, Any]]) -> list[str]:
    """How far the campaign is, per device model (every problem of the campaign counted)."""
    devices = sorted({r["device"] for r in rows})
    if not devices:
        return [f"campaign {campaign.name}: 0 of {len(campaign.problems)} problem(s) done (no worker has started)"]
    return [f"campaign {campaign.name}: {sum(r['done'] for r in rows if r['device'] == d)} of {len(campaign.problems)} "
            f"problem(s) done on {d}" for d in devices]


def storage_advice(storage: str, workers: int) -> str | None:
    """What to say of a campaign's storage before its workers start: several workers on one SQLite
    file wait for each other's writes (every finished trial is written, Optuna's SQL storage spends
    about 40 ms of CPU on one, and SQLite lets one writer in at a time), which a journal file does not
    make them do (benchmarks/bench_campaign_overhead.py: replayed measurements, no GPU). None: nothing
    to say."""
    if workers < 2 or not storage.startswith("sqlite:///"):
        return None
    return (f"{workers} workers share one SQLite file, which lets one of them write at a time: for several GPUs "
            f"of one host a journal file scales better (storage = \"journal:///path/studies.log\" in the "
            f"campaign file), PostgreSQL across hosts")


def resolve_storage(campaign: Campaign, create: bool = True) -> str:
    """The campaign's storage URL: the file's, else a journal file of the campaign's own in the cache
    directory (study.default_campaign_storage), its folder made only with `create` (a reader makes
    nothing)."""
    from ..tuning.study import default_campaign_storage  # (lazy: Optuna)

    return campaign.storage or default_campaign_storage(campaign.name, create)
