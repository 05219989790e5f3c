"""Re-timing a device document's records under the current timing protocol (`autogemm cache retime`):
each record's generated kernel (its winner, or the best generated kernel a cuBLAS record kept) is
verified again and timed against the baselines as a tune's finalists are (evaluate.GpuMeasurer: GPU
time in steady state against the faster of cuBLASLt as served and cupy.matmul, then single-call
latency against the served fallback). A kernel is kept only where it beats the baseline in both, by
the tune's margins; otherwise the record becomes a cuBLAS record that names it. Nothing is re-tuned:
that is `autogemm tune` or a campaign's work.

The document is rewritten (atomically, under its lock) after every record, so an interrupted run
keeps what it finished and a rerun skips the records already at the current protocol.
"""

from __future__ import annotations

import logging
import dataclasses
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..results.cache import Record, TuningCache, cublas_record, filed_record, write_json
from ..kernels.compile import compile_many
from .evaluate import LATENCY_MARGIN, MIN_NOISE
from .measurers import measurer_for
from ..problem import Device
from ..results.provenance import host, now, runtime_versions
from ..kernels.render import kernel_digest, render
from .timing import PROTOCOL

log: logging.Logger = logging.getLogger(__name__)
RETIME_ROUNDS = 3


def _spread(values: list[float]) -> float:
    """Half the range of repeated timings over their median."""
    return (max(values) - min(values)) / (2 * statistics.median(values))


@dataclass
class Retimed:
    key: str
    before: str  # what the record served: a config name or "cublas"
    after: str
    ratio: float | None  # GPU-time ratio of the generated kernel (None: nothing generated to time)
    latency_ratio: float | None
    note: str = ""


def retime_record(record: Record, device: Device, seed: int = 0) -> Record:
    """`record` measured again under the current protocol on this GPU (module docstring)."""
    import cupy  # (lazy: CuPy)

    problem = record.problem_object
    config = record.generated_config
    measurer = measurer_for(problem, device, seed)
    try:
        # rounds in which the baselines and the kernel take turns: their spread is the noise a kernel
        # must beat the baseline by (large 16-bit products vary by several percent with the GPU's power)
        baseline_rounds, kernel_rounds, each = [], [], {}
        measurement = None
        for _ in range(RETIME_ROUNDS):
            baseline_rounds.append(measurer.time_cublas())
            for name, ms in measurer.baselines.items():
                each.setdefault(name, []).append(ms)
            if config is not None and (measurement is None or measurement.ok):
                measurement = measurer.measure(config, None, final=True)
                if measurement.ok:
                    kernel_rounds.append(measurement.time_ms)
        baseline_ms = statistics.median(baseline_rounds)
        if kernel_rounds:
            measurement.time_ms = statistics.median(kernel_rounds)
            measurement.tflops = problem.flops / measurement.time_ms / 1e9
        noise = max(MIN_NOISE, *(_spread(values) for values in (baseline_rounds, kernel_rounds) if values))
        latency = measurer.single_call(config) if measurement is not None and measurement.ok else None
        baselines = {name: statistics.median(values) for name, values in each.items()}
        if latency is None:  # the fallback's own latency, for the record
            baseline_latency_us = measurer.fallback_latency_us()
    finally:
        del measurer
        cupy.get_default_memory_pool().free_all_blocks()
    common = dict(date=now(), versions=runtime_versions(), host=host(), protocol=PROTOCOL, baselines=baselines,
                  device=device.name, provisional=False, cublas_ms=baseline_ms,
                  cublas_tflops=problem.flops / baseline_ms / 1e9)
    if measurement is None or not measurement.ok:
        note = "" if measurement is None else f" ({measurement.kind}: {measurement.message[:200]})"
        best = dict(record.best_generated)
        if measurement is not None:
            best["retime"] = f"failed{note}"
        template_hash = record.template_hash if best else ""  # (a cuBLAS record naming no kernel is never stale)
        return dataclasses.replace(record, family="cublas", config={}, config_name="cublas", time_ms=baseline_ms,
                                   template_hash=template_hash,
                                   tflops=problem.flops / baseline_ms / 1e9, ratio=1.0, rel_error=float("nan"),
                                   best_generated=best, latency_us=baseline_latency_us,
                                   baseline_latency_us=baseline_latency_us, **common)
    generated = dataclasses.replace(
        record, family=config.family, config={k: v for k, v in config.to_dict().items() if k != "family"},
        config_name=config.name, best_generated={}, time_ms=measurement.time_ms, tflops=measurement.tflops,
        ratio=baseline_ms / measurement.time_ms, rel_error=measurement.rel_error,
        source_digest=kernel_digest(config, problem), latency_us=latency.kernel_us,
        baseline_latency_us=latency.baseline_us, **common)
    if generated.ratio > 1 + noise and latency.ratio > 1 + LATENCY_MARGIN:
        return generated
    return cublas_record(generated, latency.ratio)


def _precompile(records: list[Record], device: Device, jobs: int) -> None:
    """Compiles every kernel to be timed in parallel (the cubins land in the kernel cache, where the
    measurements find them)."""
    sources = []
    for record in records:
        config = record.generated_config
        if config is not None:
            try:
                sources.append(render(config, record.problem_object))
            except Exception as exc:  # a config that no longer renders: its measurement will say so
                log.warning("autogemm: %s: %s does not render (%s)", record.problem, config.name, exc)
    if sources:
        compile_many(sources, device.arch, jobs)


def retime_document(path: Path, device: Device, *, force: bool = False, jobs: int = 8, only: Any = None,
                    progress: Any = print) -> list[Retimed]:
    """Re-times every current record of the device document at `path` (written for `device`'s model)
    that is not at the current protocol yet, or whose kernel this process's NVRTC compiles with another
    release than the record's (all of them with `force`; `only`: keys containing one of these texts);
    returns what changed, record by record."""
    from filelock import FileLock  # (lazy: only this lock needs it)

    cache = TuningCache(path.parent, shipped=False)
    document = cache._load(path, device.slug, repair=False)
    if document.get("device") not in (None, device.slug):
        raise ValueError(f"{path} holds records of {document.get('device')}, not of this GPU ({device.slug})")
    keys = [key for key in sorted(document["entries"])
            if not only or any(text in key for text in only)]
    todo = []
    for key in keys:
        try:
            record = filed_record(key, document["entries"][key])
        except ValueError as exc:
            progress(f"skip    {key}: not a valid record ({exc})")
            continue
        if record.stale:
            progress(f"skip    {key}: stale (its kernel's source has changed since it was tuned)")
            continue
        if record.current_protocol and not record.compiled_by_another_nvrtc and not force:
            continue
        todo.append(record)
    read = {record.problem: document["entries"][record.problem] for record in todo}  # as re-timed
    _precompile(todo, device, jobs)
    done: list[Retimed] = []
    for index, record in enumerate(todo, 1):
        started = time.perf_counter()
        try:
            new = retime_record(record, device)
        except Exception as exc:  # one record's failure is reported; the others go on
            progress(f"FAILED  {record.problem}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        with FileLock(str(path) + ".lock", timeout=60):
            current = cache._load(path, device.slug, repair=False)
            if current["entries"].get(record.problem) != read[record.problem]:
                # a tune (or another retime) wrote this entry while it was being measured: what it
                # wrote is newer than what was re-timed, and stays
                progress(f"kept    {record.problem}: its record changed while it was re-timed (a tune finished)")
                continue
            current["entries"][record.problem] = new.to_json()
            write_json(path, current)
        best = new.best_generated if new.is_cublas else None
        ratio = new.ratio if not new.is_cublas else (best or {}).get("ratio")
        latency = new.latency_ratio if not new.is_cublas else (best or {}).get("latency_ratio")
        item = Retimed(record.problem, record.config_name, new.config_name, ratio, latency)
        done.append(item)
        shown = lambda x: f"{x:.3f}x" if isinstance(x, (int, float)) else "-"  # noqa: E731
        progress(f"[{index}/{len(todo)}] {record.problem}: {item.before} -> {item.after}  GPU {shown(ratio)}, "
                 f"latency {shown(latency)}  (baseline {new.cublas_ms * 1e3:.1f} us; {time.perf_counter() - started:.1f} s)")
    return done
