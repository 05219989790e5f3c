"""Which kernel serves a problem, as a pure function of the cache's contents: the exact record, else
the record of the nearest tuned shape (same dtype, compute mode and layout), else the family's
built-in default for the problem's size, else cuBLAS through cupy.matmul."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import dtypes
from .families import GemmConfig, config_from_name, family_for
from .problem import Problem

# Output sizes (M x N x batch) from which a problem counts as "large" or "medium" for the defaults.
LARGE_OUTPUTS = 2048 * 2048
MEDIUM_OUTPUTS = 256 * 256
# A K this many times the output's longer side leaves most SMs idle unless K is split across blocks.
LONG_K_RATIO = 8
MAX_DEFAULT_SPLIT_K = 8


@dataclass
class Choice:
    source: str  # "cache", "shipped cache", "nearest", "default", "cupy", "autotune"
    config: GemmConfig | None
    reason: str
    record: object | None = None  # the cache record the choice came from
    details: dict = field(default_factory=dict)
    provisional: bool = False  # a tune of this problem was still running elsewhere when chosen


def size_class(problem: Problem) -> str:
    outputs = problem.m * problem.n * problem.batch
    if outputs >= LARGE_OUTPUTS:
        return "large"
    if outputs >= MEDIUM_OUTPUTS:
        return "medium"
    return "small"


def default_config(problem: Problem, device) -> GemmConfig | None:
    """The built-in config for a problem nothing was tuned for: those of its size class first, then
    the others (largest first), the first that can run it; None when none can."""
    wanted = size_class(problem)
    ranked = [(cls, config_from_name(name)) for cls, name in family_for(problem.dtype, problem.compute).defaults(problem)]
    order = [c for cls, c in ranked if cls == wanted] + [c for cls, c in ranked if cls != wanted]
    for config in order:
        if problem.k >= LONG_K_RATIO * max(problem.m, problem.n) and wanted != "large":
            # a long K and a small output leave most SMs idle: split K across blocks
            splits = min(MAX_DEFAULT_SPLIT_K, config.tiles_k(problem))
            split_config = config.replace(split_k=max(1, 2 ** int(math.log2(max(splits, 1)))))
            if not split_config.check(problem, device):
                return split_config
        if not config.check(problem, device):
            return config
    return None


def log_distance(p: Problem, q: Problem) -> float:
    return math.sqrt(sum(math.log(x / y) ** 2 for x, y in ((p.m, q.m), (p.n, q.n), (p.k, q.k), (p.batch, q.batch))))


def choose(problem: Problem, device, exact, records) -> Choice:
    """Pure selection over cache contents: `exact` is (record, source) of this problem or None;
    `records` are the device's current records (for the nearest shape)."""
    if dtypes.find(problem.dtype, problem.compute) is None:
        return Choice("cupy", None, f"no template for {problem.dtype}/{problem.compute} yet: cupy.matmul")
    if exact is not None:
        record, source = exact
        config = record.config_object
        if not config.check(problem, device):
            where = "shipped cache" if source == "shipped" else "cache"
            return Choice(where, config, f"tuned for this problem ({record.ratio:.3f}x cuBLAS on {record.date[:10]})",
                          record)
    same_kind = [r for r in records
                 if (r.problem_object.dtype, r.problem_object.compute, r.problem_object.layout)
                 == (problem.dtype, problem.compute, problem.layout)]
    for record in sorted(same_kind, key=lambda r: log_distance(problem, r.problem_object)):
        config = record.config_object
        if config.check(problem, device) and config.split_k > 1:
            config = config.replace(split_k=max(1, min(config.split_k, config.tiles_k(problem))))
        if not config.check(problem, device):
            return Choice("nearest", config, f"tuned for the nearest shape {record.problem} "
                          f"(log-distance {log_distance(problem, record.problem_object):.2f})", record)
    config = default_config(problem, device)
    if config is not None:
        return Choice("default", config, f"built-in {size_class(problem)}-problem configuration (nothing tuned nearby)")
    return Choice("cupy", None, "no configuration of the template can run this problem: cupy.matmul")
