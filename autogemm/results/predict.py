"""Predicting how a tuned config does on a shape nobody tuned, from what the cache measured.

The model predicts times, not a ratio carried from one shape to another. For a record measured at
shape P (GPU times of its kernel, t_P, and of the faster baseline, b_P, under the current timing
protocol) and a new shape Q:

    kernel    t_Q = max(t_P · (flops_Q / flops_P) · (fill_P / fill_Q),  bytes_Q / bandwidth,  floor)
    baseline  b_Q = max(b_P · (flops_Q / flops_P),                       bytes_Q / bandwidth,  floor)

`fill` is the fraction of the GPU's block slots over the config's waves that compute inside the
matrix (last-wave fill times tile fill: "minimize waves, then maximize the last wave's utilization");
cuBLAS picks its tiles per shape and is assumed to keep its efficiency, so a worse fill at Q costs
only the generated kernel, and a better one helps both (the factor is capped at 1). The roofline term
(bytes moved once over the device's achievable bandwidth) and the floor (a launch) bind both sides
alike, so a small shape's prediction tends to a tie,
never to the ratio of a large one. Latency adds each side's host time as the record measured it.

A prediction is made only from records within MAX_FLOPS_RATIO of the new shape's work and
MAX_INTENSITY_RATIO of its arithmetic intensity (a kernel tuned for a memory-bound GEMV says nothing
of a compute-bound cube), measured under the current protocol (timing.PROTOCOL: older ratios had
host-bound baselines). A generated kernel is chosen only where both its predicted GPU time and
latency beat the baseline's by a margin that grows with the distance between the shapes; the online
guard (guard.py) then checks it on the user's own operands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import dtypes
from ..problem import Device, Problem

# A generated kernel must be predicted this much faster than cuBLAS to be chosen over it, plus
# DISTANCE_MARGIN per unit of log-distance between the shapes (the model's extrapolation risk),
# plus OTHER_LAYOUT_MARGIN when the record is of another layout.
WIN_MARGIN = 0.03
DISTANCE_MARGIN = 0.05
OTHER_LAYOUT_MARGIN = 0.05
# how far a record's evidence reaches: work within this factor, arithmetic intensity within that
MAX_FLOPS_RATIO = 64.0
MAX_INTENSITY_RATIO = 4.0
THREADS_PER_SM = 2048  # a fallback where a device does not say
# the shortest a kernel's GPU time gets (a launch and its ramp); a record may show a shorter one
LAUNCH_FLOOR_MS = 0.004
# the fraction of the memory's peak bandwidth a GEMM's streams reach
ACHIEVED_BANDWIDTH = 0.9
# Known configs a tune enqueues before its search: the best predictions, the nearest winners.
SEEDED_PREDICTIONS = 3
SEEDED_NEAREST = 3


def bytes_moved(problem: Problem) -> int:
    """The fewest bytes a GEMM moves through device memory: A and B read once, C written once."""
    itemsize = dtypes.lookup(problem.dtype).itemsize
    return itemsize * problem.batch * (problem.m * problem.k + problem.k * problem.n + problem.m * problem.n)


def intensity(problem: Problem) -> float:
    return problem.flops / bytes_moved(problem)


def is_evidence(record: Any) -> bool:
    """Whether a record may inform predictions: final (not a running tune's best so far) and timed
    under the current protocol."""
    return not record.provisional and record.current_protocol


def log_distance(p: Problem, q: Problem) -> float:
    return math.sqrt(sum(math.log(x / y) ** 2 for x, y in ((p.m, q.m), (p.n, q.n), (p.k, q.k), (p.batch, q.batch))))


def blocks_per_sm(config: Any, problem: Problem, device: Device) -> int:
    """Blocks of `config` one SM holds at once, by threads, shared memory and estimated registers."""
    threads = config.threads
    by_threads = (device.max_threads_per_sm or THREADS_PER_SM) // threads
    smem = config.smem_bytes(problem) + 1024  # the driver reserves 1 KB per block
    by_smem = device.smem_per_sm // smem if smem > 1024 else by_threads
    registers = getattr(config, "estimated_registers", None)
    by_registers = by_threads
    if registers is not None:
        per_block = max(1, registers(problem)) * threads
        by_registers = device.regs_per_block // per_block if per_block else by_threads
    return max(1, min(by_threads, by_smem, by_registers))


def utilization(config: Any, problem: Problem, device: Device) -> float:
    """The fraction of the GPU's block slots over the config's waves that compute inside the
    matrix: last-wave fill times tile fill on M, N and K. Stream-K spreads the tail's work over
    the whole last wave, so only the tile padding counts for it."""
    problem = config.kernel_problem(problem)  # tiles cover the product the kernel computes
    tiles_m, tiles_n = -(-problem.m // config.bm), -(-problem.n // config.bn)
    split = config.split_k
    k_step = config.bk * split
    tile_fill = (problem.m / (tiles_m * config.bm)) * (problem.n / (tiles_n * config.bn)) \
        * (problem.k / (-(-problem.k // k_step) * k_step))
    if config.launch_kind == "stream_k" or getattr(config, "stream_k", False):  # (SIMT's kind; Hopper's knob)
        return tile_fill
    blocks = tiles_m * tiles_n * problem.batch * split
    slots = device.sm_count * blocks_per_sm(config, problem, device)
    waves = -(-blocks // slots)
    return tile_fill * blocks / (waves * slots)


@dataclass
class Candidate:
    """One config considered for a shape: where it was measured, what the model predicts for it
    (GPU times of the kernel and the baseline, their ratio, and the ratio of latencies), and what it
    must reach to be chosen."""

    config: object
    source: str  # the problem key of the record it comes from
    measured_ratio: float
    predicted_ratio: float
    needed_ratio: float
    note: str = ""
    predicted_us: float = 0.0  # the kernel's GPU time
    baseline_us: float = 0.0  # the baseline's
    latency_ratio: float | None = None  # predicted baseline latency over the kernel's

    @property
    def wins(self) -> bool:
        latency_ok = self.latency_ratio is None or self.latency_ratio >= self.needed_ratio
        return self.predicted_ratio >= self.needed_ratio and latency_ok

    def to_json(self) -> dict[str, Any]:
        out = {"config": self.config.name, "from": self.source, "measured_ratio": round(self.measured_ratio, 4),
               "predicted_ratio": round(self.predicted_ratio, 4), "needed_ratio": round(self.needed_ratio, 4),
               "predicted_us": round(self.predicted_us, 2), "baseline_us": round(self.baseline_us, 2),
               "wins": self.wins}
        if self.latency_ratio is not None:
            out["latency_ratio"] = round(self.latency_ratio, 4)
        return {**out, **({"note": self.note} if self.note else {})}


def tuned_configs(record: Any) -> Any:
    """(config, ratio, kernel ms) of what a record measured: its winner, or for a cuBLAS record the
    best generated kernel it lost with."""
    if record.config_object is not None:
        yield record.config_object, record.ratio, record.time_ms
    elif record.best_generated:
        ratio = record.best_generated["ratio"]
        yield record.best_generated_object, ratio, record.cublas_ms / ratio


@dataclass(frozen=True)
class _Limits:
    """What every prediction on a device and dtype shares: the bandwidth of the roofline and the
    launch floor."""

    bandwidth: float  # bytes per ms
    floor_ms: float


def _limits(records, device: Device) -> _Limits:
    """The device's achievable bandwidth (from its peak where known, else the best the records show)
    and the launch floor (LAUNCH_FLOOR_MS, or a shorter GPU time a record measured)."""
    bandwidth, floor = 0.0, LAUNCH_FLOOR_MS
    for record in records:
        problem = record.problem_object
        for ms in (record.time_ms, record.cublas_ms):
            bandwidth = max(bandwidth, bytes_moved(problem) / ms)
            floor = min(floor, ms)
    if device.memory_bandwidth:
        bandwidth = max(bandwidth, ACHIEVED_BANDWIDTH * device.memory_bandwidth / 1e3)
    return _Limits(bandwidth, floor)


def _host_us(record, kernel_ms: float) -> tuple[float, float] | None:
    """(host us of a call of the record's kernel, of the baseline's): what single-call latency adds
    to GPU time, as the record measured them; None where it has no latencies."""
    if not (record.latency_us and record.baseline_latency_us):
        return None
    kernel_latency = record.latency_us
    if record.is_cublas:  # its latency_us is cuBLAS's; the generated kernel's only as a ratio
        latency_ratio = record.best_generated.get("latency_ratio")
        if not isinstance(latency_ratio, (int, float)) or latency_ratio <= 0:
            return None
        kernel_latency = record.baseline_latency_us / latency_ratio
    return (max(0.0, kernel_latency - kernel_ms * 1e3), max(0.0, record.baseline_latency_us - record.cublas_ms * 1e3))


def candidates(problem: Problem, device: Device, records: Any) -> list[Candidate]:
    """Every config of the evidence records (same dtype, compute mode and epilogue, within reach of `problem`)
    that can run `problem`, with its predicted GPU times and ratios; best prediction first."""
    # (the same epilogue too: a record with one timed its kernel and the baseline with the epilogue's work;
    # and grouped or not alike: a grouped record's kernel and baselines are another product's)
    evidence = [r for r in records if is_evidence(r)
                and (r.problem_object.dtype, r.problem_object.compute, r.problem_object.epilogue,
                     r.problem_object.grouped) == (problem.dtype, problem.compute, problem.epilogue, problem.grouped)]
    limits = _limits(evidence, device)
    out: list[Candidate] = []
    seen: set[str] = set()
    for record in evidence:
        tuned = record.problem_object
        scale = problem.flops / tuned.flops
        if not 1 / MAX_FLOPS_RATIO <= scale <= MAX_FLOPS_RATIO or \
                not 1 / MAX_INTENSITY_RATIO <= intensity(problem) / intensity(tuned) <= MAX_INTENSITY_RATIO:
            continue
        for config, ratio, kernel_ms in tuned_configs(record):
            if config.split_k > 1 and config.check(problem, device):
                config = config.replace(split_k=max(1, min(config.split_k, config.tiles_k(problem))))
            if config.name in seen or config.check(problem, device):
                continue
            seen.add(config.name)
            before = utilization(config, tuned, device)
            # never better than measured: where the tuned shape filled the GPU poorly, cuBLAS was held
            # back there too, and a better fill here helps both
            fill = min(1.0, utilization(config, problem, device) / before) if before > 0 else 0.0
            roof = max(bytes_moved(problem) / limits.bandwidth if limits.bandwidth else 0.0, limits.floor_ms)
            baseline_ms = max(record.cublas_ms * scale, roof)
            predicted_ms = max(kernel_ms * scale / fill, roof) if fill > 0 else float("inf")
            hosts = _host_us(record, kernel_ms)
            latency = None if hosts is None else \
                (hosts[1] + baseline_ms * 1e3) / (hosts[0] + predicted_ms * 1e3)
            distance = log_distance(problem, tuned)
            needed = 1 + WIN_MARGIN + DISTANCE_MARGIN * distance
            note = ""
            if tuned.layout != problem.layout:
                needed += OTHER_LAYOUT_MARGIN
                note = f"measured on layout {tuned.layout}"
            out.append(Candidate(config, record.problem, ratio, baseline_ms / predicted_ms, needed, note,
                                 predicted_ms * 1e3, baseline_ms * 1e3, latency))
    out.sort(key=lambda c: min(c.predicted_ratio, c.latency_ratio or c.predicted_ratio) - c.needed_ratio,
             reverse=True)
    return out


def known_configs(problem: Problem, device: Device, cache: Any, space: Any) -> list[Any]:
    """Configs of the space's family worth measuring first in a tune (`cache`: a TuningCache): this problem's record (its winner, or
    the generated kernel a cuBLAS record beat), the model's best predictions from the device's
    other records, and the winners of the nearest tuned problems."""
    records = [r for _, r in cache.records(device.slug) if not r.stale]
    family = space.config_class.family
    out: list[Any] = []
    exact = cache.lookup(problem, device.slug)
    if exact is not None:
        out += [config for config, _, _ in tuned_configs(exact[0])]
    out += [c.config for c in candidates(problem, device, records)[:SEEDED_PREDICTIONS]]
    same_kind = [r for r in records if r.problem_object.dtype == problem.dtype
                 and r.problem_object.compute == problem.compute and r.problem_object.grouped == problem.grouped]
    for record in sorted(same_kind, key=lambda r: log_distance(problem, r.problem_object))[:SEEDED_NEAREST]:
        out += [config for config, _, _ in tuned_configs(record)]
    unique = {c.name: c for c in out if c.family == family}
    return list(unique.values())
