"""What a search keeps: the winner among its finalists, and the records it caches (its best kernel
as it is found, provisional, and the winner, or cuBLAS, at the end)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..results.cache import Record, TuningCache
from ..measure.evaluate import LATENCY_MARGIN, MIN_NOISE, Evaluator, Latency, Measurement, Sustained
from ..measure.timing import SUSTAINED_FROM_MS
from ..families.waves import work_shape
from ..problem import Device, Problem
from ..results.provenance import host, now, runtime_versions
from ..kernels.render import kernel_digest, kernel_template_hash
from .result import TuneError

log: logging.Logger = logging.getLogger(__name__)
# finalists timed sustained against the baselines (the best of the short re-timings, one of another work shape)
SUSTAINED_FINALISTS = 2


@dataclass
class Winner:
    """The configuration a search keeps, with the figures it is cached with."""

    config: object
    measurement: Measurement
    cublas_ms: float
    noise: float  # cuBLAS is kept where the kernel beats it by no more than this
    latency: Latency | None = None  # the kernel's and the served cuBLAS fallback's, one call at a time
    # timed sustained (Record.sustained's figures; empty: not), and then each baseline's sustained ms
    sustained: dict[str, Any] = field(default_factory=dict)
    baselines: dict[str, float] | None = None

    @property
    def gpu_bound(self) -> bool:
        """Whether the decision is made on sustained GPU time (a product of SUSTAINED_FROM_MS or more)."""
        return bool(self.sustained)


def retimed_best(finalists: list[Any], evaluator: Evaluator) -> Winner:
    """The fastest of the finalists re-timed together with cuBLAS, and timed one call at a time
    (host time and all) as matmul serves it. Where a call takes SUSTAINED_FROM_MS or more of GPU
    time, SUSTAINED_FINALISTS of them (sustained_contenders) are then timed sustained with the baselines
    (about a second each, in rounds, the GPU never idle: as a training or prefill loop runs), the faster
    of them again where its lead is inside the noise (`_settled`), and the winner and its figures are those."""
    remeasured, cublas_ms = evaluator.retime(finalists)
    ranked = sorted((m.time_ms, i) for i, m in enumerate(remeasured) if m.ok)
    if not ranked:
        raise TuneError(f"every finalist failed its re-check: {[m.kind for m in remeasured]}")
    winner, chosen = finalists[ranked[0][1]], remeasured[ranked[0][1]]
    chosen.rel_error = _rel_error(chosen, remeasured)
    if min(cublas_ms, chosen.time_ms) >= SUSTAINED_FROM_MS:
        contenders = sustained_contenders(finalists, [i for _, i in ranked], evaluator.problem, evaluator.device)
        sustained = evaluator.sustained([finalists[i] for i in contenders])
        if sustained is not None:
            contenders, sustained = _settled(finalists, contenders, sustained, evaluator)
            return _sustained_winner(finalists, remeasured, contenders, sustained, cublas_ms, evaluator)
    noise = evaluator.retime_noise
    return Winner(winner, chosen, cublas_ms, noise, evaluator.single_call(winner))


def sustained_contenders(finalists: list[Any], ranked: list[int], problem: Problem, device: Device) -> list[int]:
    """Which finalists (indices, `ranked` by their short re-timings, fastest first) are timed sustained: the
    fastest, then the fastest of another work shape (families/waves.py: work_shape), then the next fastest, up
    to SUSTAINED_FINALISTS. Variants of one tile (stages, group_m, a cluster) keep their order under power,
    where another tile need not: on an H200 at BF16 NN 4096 x 11008 x 4096 a 10 s tune's fastest, 256 x 128
    ping-pong, re-timed behind two 128 x 256 variants and was not timed sustained, and the tune kept 128 x 256
    (1.022x cuBLAS); timed sustained side by side, that ping-pong tile ran 1.070x torch.matmul and a 128 x 256
    one 1.013x."""
    if not ranked:
        return []
    shapes = {index: work_shape(finalists[index], problem, device) for index in ranked}
    first = ranked[0]
    other = [index for index in ranked[1:] if shapes[index] != shapes[first]]
    rest = [index for index in ranked[1:] if index not in other[:1]]
    return [first, *other[:1], *rest][:SUSTAINED_FINALISTS]


def _settled(finalists: list[Any], contenders: list[int], sustained: Sustained,
             evaluator: Evaluator) -> tuple[list[int], Sustained]:
    """(contenders, figures) to decide on: where the faster contender leads the baseline by no more than the
    noise of its rounds and that noise is above MIN_NOISE, so that more rounds could settle which is faster,
    it is timed sustained once more with the baselines, and its rounds are pooled with the first ones
    (twice the rounds: the noise falls by about 30%). Otherwise, or where the second timing fails, the
    figures as they are. Only a lead is looked at again: a kernel behind the baseline keeps cuBLAS either
    way, and a noise already at MIN_NOISE is the least assumed whatever the rounds (more of them would only
    draw the verdict again). On an H200 at the power limit, the leads that decide half-precision records are
    that small: in 20 rounds of nine H200-document products, the best kernel of each ran 0.977-1.034x
    torch.matmul while each competitor's rounds spread by 1.4-4.8% (journal, session 72)."""
    best = sustained.fastest
    ratio, noise = sustained.baseline_ms / sustained.kernel_ms[best], sustained.noise(best)
    if not (noise > MIN_NOISE and 1 < ratio <= 1 + noise):
        return contenders, sustained
    more = evaluator.sustained([finalists[contenders[best]]])
    pooled = sustained.pooled(best, more) if more is not None else None
    if pooled is None:
        return contenders, sustained
    log.info("autogemm: %s led cuBLAS by %.2f%% within a noise of %.2f%%: timed again, %d rounds pooled",
             finalists[contenders[best]].name, (ratio - 1) * 100, noise * 100, pooled.rounds)
    return [contenders[best]], pooled


def _rel_error(measurement: Measurement, remeasured: list[Measurement]) -> float | None:
    """The measurement's error against float64, or where its re-check gave none, another finalist's."""
    if measurement.rel_error is not None:
        return measurement.rel_error
    return next((m.rel_error for m in remeasured if m.ok and m.rel_error), None)


def _sustained_winner(finalists, remeasured, contenders: list[int], sustained: Sustained, burst_cublas_ms: float,
                      evaluator: Evaluator) -> Winner:
    """The faster contender in sustained GPU time, with its sustained figures and the noise of its paired
    ratios to the faster baseline (Sustained.noise)."""
    best = sustained.fastest
    index = contenders[best]
    burst = remeasured[index]
    ms = sustained.kernel_ms[best]
    measurement = Measurement(ok=True, time_ms=ms, tflops=evaluator.problem.flops / ms / 1e9,
                              rel_error=_rel_error(burst, remeasured))
    figures = {"sm_clock_mhz": sustained.sm_clock_mhz, "power_w": sustained.power_w, "rounds": sustained.rounds,
               "burst_ratio": round(burst_cublas_ms / burst.time_ms, 4)}
    noise = sustained.noise(best)
    config = finalists[index]
    return Winner(config, measurement, sustained.baseline_ms, noise, evaluator.single_call(config), sustained=figures,
                  baselines=dict(sustained.baselines))


def keeps_cublas(ratio: float, noise: float, latency: Any, gpu_bound: bool) -> bool:
    """Whether cuBLAS is kept over the best generated kernel: it beats cuBLAS's GPU time (`ratio`, the
    baseline's time over the kernel's) by no more than `noise`, or loses in single-call latency. A
    GPU-bound product (timed sustained) may not lose latency beyond the noise, since its latency is
    mostly that same GPU time; a shorter one must win latency by LATENCY_MARGIN, since there host
    time decides what a user waits for."""
    if ratio <= 1 + noise:
        return True
    if latency is None:
        return False
    if gpu_bound:
        return latency.ratio < 1 - max(noise, LATENCY_MARGIN)
    return latency.ratio <= 1 + LATENCY_MARGIN


def best_so_far(finalists: list[Any], known: dict[str, float], problem: Problem, evaluator: Evaluator) -> Winner:
    """After Ctrl-C or a lost GPU: the best verified measurement as it stands, not re-timed."""
    winner = finalists[0]
    if winner.name not in known:
        raise TuneError("interrupted before any configuration was measured")
    tflops = known[winner.name]
    measurement = Measurement(ok=True, time_ms=problem.flops / tflops / 1e9, tflops=tflops)
    return Winner(winner, measurement, evaluator.cublas_ms, MIN_NOISE)


class RecordKeeper:
    """Makes a search's cache records and caches them. Where the cache cannot be written
    (read-only, full), says so once and goes on: the tune's result is reported all the same."""

    def __init__(self, cache: TuningCache, problem: Problem, device: Device, study_name: str, evaluator: Evaluator,
                 started: float):
        self.cache, self.problem, self.device, self.study_name = cache, problem, device, study_name
        self.evaluator, self.started = evaluator, started  # (wall times count from `started`, a perf_counter)
        self.errors: list[str] = []  # the cache's, one per record it could not keep

    def record(self, config: Any, measurement: Measurement, cublas_ms: float, trials: dict[str, Any], provisional: bool,
               latency: Latency | None = None, sustained: dict[str, Any] | None = None,
               baselines: dict[str, float] | None = None) -> Record:
        problem, evaluator = self.problem, self.evaluator
        return Record(
            problem=problem.key, family=config.family,
            config={k: v for k, v in config.to_dict().items() if k != "family"}, config_name=config.name,
            time_ms=measurement.time_ms, tflops=measurement.tflops, cublas_ms=cublas_ms,
            cublas_tflops=problem.flops / cublas_ms / 1e9, ratio=cublas_ms / measurement.time_ms,
            rel_error=measurement.rel_error if measurement.rel_error is not None else float("nan"),
            template_hash=kernel_template_hash(config.template), device=self.device.name,
            versions=runtime_versions(), date=now(), host=host(), source_digest=kernel_digest(config, problem),
            trials=trials, wall_s=time.perf_counter() - self.started, study=self.study_name, provisional=provisional,
            protocol=evaluator.protocol, latency_us=latency.kernel_us if latency else 0.0,
            baseline_latency_us=latency.baseline_us if latency else 0.0,
            baselines=dict(evaluator.baselines if baselines is None else baselines), sustained=dict(sustained or {}),
        )

    def keep(self, record: Record) -> Path | None:
        """Caches `record`; returns where, or None where the cache could not be written."""
        try:
            return self.cache.store(record, self.device.slug)
        except OSError as exc:
            if not self.errors:
                log.warning("autogemm: cannot write tuned results to %s (%s); the tune goes on, its result will not "
                            "be cached", self.cache.directory, exc)
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return None
