"""Predicting how a tuned config does on a shape nobody tuned, from what the cache measured.

A config's speed on a shape is its speed on the shape it was tuned for, scaled by how well it fills
the GPU on each: the fraction of the launched block slots that do work in the waves it takes (the
last wave's fill: "minimize waves, then maximize the last wave's utilization"), times the fraction
of each tile that is inside the matrix on M, N and K (padding wasted on tails). cuBLAS picks its
tiles per shape, so it is assumed to keep its own efficiency from one shape to the next: the
prediction is conservative where cuBLAS suffers as well (tiny or skinny shapes), and that
conservatism is the point: a generated kernel is served only where it is predicted to win by a
margin that grows with how far the shape is from the one it was measured on.

    predicted ratio = measured ratio x min(1, utilization(config, new shape) / utilization(config, tuned shape))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .problem import Device, Problem

# A generated kernel must be predicted this much faster than cuBLAS to be chosen over it, plus
# DISTANCE_MARGIN per unit of log-distance between the shapes (the model's extrapolation risk),
# plus OTHER_LAYOUT_MARGIN when the record is of another layout.
WIN_MARGIN = 0.03
DISTANCE_MARGIN = 0.05
OTHER_LAYOUT_MARGIN = 0.05
THREADS_PER_SM = 2048  # a fallback where a device does not say
# Known configs a tune enqueues before its search: the best predictions, the nearest winners.
SEEDED_PREDICTIONS = 3
SEEDED_NEAREST = 3


def log_distance(p: Problem, q: Problem) -> float:
    return math.sqrt(sum(math.log(x / y) ** 2 for x, y in ((p.m, q.m), (p.n, q.n), (p.k, q.k), (p.batch, q.batch))))


def blocks_per_sm(config, problem: Problem, device: Device) -> int:
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


def utilization(config, problem: Problem, device: Device) -> float:
    """The fraction of the GPU's block slots over the config's waves that compute inside the
    matrix: last-wave fill times tile fill on M, N and K. Stream-K spreads the tail's work over
    the whole last wave, so only the tile padding counts for it."""
    problem = config.kernel_problem(problem)  # tiles cover the product the kernel computes
    tiles_m, tiles_n = -(-problem.m // config.bm), -(-problem.n // config.bn)
    split = config.split_k
    k_step = config.bk * split
    tile_fill = (problem.m / (tiles_m * config.bm)) * (problem.n / (tiles_n * config.bn)) \
        * (problem.k / (-(-problem.k // k_step) * k_step))
    if config.launch_kind == "stream_k":
        return tile_fill
    blocks = tiles_m * tiles_n * problem.batch * split
    slots = device.sm_count * blocks_per_sm(config, problem, device)
    waves = -(-blocks // slots)
    return tile_fill * blocks / (waves * slots)


@dataclass
class Candidate:
    """One config considered for a shape: where it was measured, what the model predicts for it,
    and what it must reach to be chosen."""

    config: object
    source: str  # the problem key of the record it comes from
    measured_ratio: float
    predicted_ratio: float
    needed_ratio: float
    note: str = ""

    @property
    def wins(self) -> bool:
        return self.predicted_ratio >= self.needed_ratio

    def to_json(self) -> dict:
        return {"config": self.config.name, "from": self.source, "measured_ratio": round(self.measured_ratio, 4),
                "predicted_ratio": round(self.predicted_ratio, 4), "needed_ratio": round(self.needed_ratio, 4),
                "wins": self.wins, **({"note": self.note} if self.note else {})}


def tuned_configs(record):
    """(config, ratio) pairs a record measured: its winner, or for a cuBLAS record the best
    generated kernel it lost with."""
    if record.config_object is not None:
        yield record.config_object, record.ratio
    elif record.best_generated:
        yield record.best_generated_object, record.best_generated["ratio"]


def candidates(problem: Problem, device: Device, records) -> list[Candidate]:
    """Every config of the records (same dtype and compute mode) that can run `problem`, with its
    predicted ratio to cuBLAS; best prediction first."""
    out: list[Candidate] = []
    seen: set[str] = set()
    for record in records:
        tuned = record.problem_object
        if (tuned.dtype, tuned.compute) != (problem.dtype, problem.compute):
            continue
        for config, ratio in tuned_configs(record):
            if config.split_k > 1 and config.check(problem, device):
                config = config.replace(split_k=max(1, min(config.split_k, config.tiles_k(problem))))
            if config.name in seen or config.check(problem, device):
                continue
            seen.add(config.name)
            before = utilization(config, tuned, device)
            # never above the measured ratio: where the tuned shape filled the GPU poorly, cuBLAS
            # was held back there too, and a better fill here helps both
            predicted = ratio * min(1.0, utilization(config, problem, device) / before) if before > 0 else 0.0
            distance = log_distance(problem, tuned)
            needed = 1 + WIN_MARGIN + DISTANCE_MARGIN * distance
            note = ""
            if tuned.layout != problem.layout:
                needed += OTHER_LAYOUT_MARGIN
                note = f"measured on layout {tuned.layout}"
            out.append(Candidate(config, record.problem, ratio, predicted, needed, note))
    out.sort(key=lambda c: c.predicted_ratio - c.needed_ratio, reverse=True)
    return out


def known_configs(problem: Problem, device: Device, cache, space) -> list:
    """Configs of the space's family worth measuring first in a tune (`cache`: a TuningCache): this problem's record (its winner, or
    the generated kernel a cuBLAS record beat), the model's best predictions from the device's
    other records, and the winners of the nearest tuned problems."""
    records = [r for _, r in cache.records(device.slug) if not r.stale]
    family = space.config_class.family
    out: list = []
    exact = cache.lookup(problem, device.slug)
    if exact is not None:
        out += [config for config, _ in tuned_configs(exact[0])]
    out += [c.config for c in candidates(problem, device, records)[:SEEDED_PREDICTIONS]]
    same_kind = [r for r in records if r.problem_object.dtype == problem.dtype
                 and r.problem_object.compute == problem.compute]
    for record in sorted(same_kind, key=lambda r: log_distance(problem, r.problem_object))[:SEEDED_NEAREST]:
        out += [config for config, _ in tuned_configs(record)]
    unique = {c.name: c for c in out if c.family == family}
    return list(unique.values())
