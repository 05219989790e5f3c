"""Which kernel serves a problem, as a pure function of the cache's contents, in this order of
trust: the exact record (a generated kernel, or cuBLAS where the tune kept it); else a tuned config
the model of `predict` expects to beat cuBLAS here by a margin; else cuBLAS (the call cupy.matmul
makes, through cublas_gemm). Only for a dtype cuBLAS is not asked to serve does the family's
built-in default for the problem's size come in (the GPU tests use that to run the defaults)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .. import dtypes
from ..results import predict
from ..results.provenance import nvrtc_release
from ..families import GemmConfig, config_from_name, family_for
from ..problem import Problem

# (dtype, compute) that cuBLAS serves when nothing generated is expected to win: the cublasGemmEx call
# cupy.matmul makes, with less host time per call (cublas_gemm). The `cublas_serves` column of dtypes.
CUBLAS_SERVES = {(row.name, row.compute) for row in dtypes.ROWS if row.cublas_serves}
SHOWN_CANDIDATES = 8  # candidates `explain` lists
# cublasGemmEx serves a problem whose record measured it this much faster than cuBLASLt (cublas_api)
GEMMEX_MARGIN = 0.03
# Output sizes (M x N x batch) from which a problem counts as "large" or "medium" for the defaults.
LARGE_OUTPUTS = 2048 * 2048
MEDIUM_OUTPUTS = 256 * 256
# A K this many times the output's longer side leaves most SMs idle unless K is split across blocks.
LONG_K_RATIO = 8
MAX_DEFAULT_SPLIT_K = 8


class ChoiceSource(StrEnum):
    """Where the choice of kernel for a problem came from (`Choice.source`, explain()'s "source"). Its
    members are strings ("cache" == ChoiceSource.CACHE, f"{ChoiceSource.CACHE}" == "cache"), so that
    explain's output, the benchmarks' tables and comparisons with plain strings read the same text."""

    CACHE = "cache"  # the problem's record in the user cache (a kernel, or cuBLAS kept)
    SHIPPED_CACHE = "shipped cache"  # the problem's record in the cache shipped with the package
    AUTOTUNE = "autotune"  # the problem tuned by this call (matmul(..., tune=True))
    PREDICTED = "predicted"  # a tuned config the model expects to beat cuBLAS here (under the guard)
    GUARD = "guard"  # cuBLAS: the guarded kernel lost to it on this problem's first calls
    RACE = "race"  # the first-call race's winner (matmul(..., race=True))
    DEFAULT = "default"  # the family's built-in config, for a dtype cuBLAS is not asked to serve
    CUBLAS = "cublas"  # cuBLAS: nothing generated is expected to win
    CUPY_MATMUL = "cupy.matmul"  # integer, boolean or complex operands (explain only: no kernel is chosen)


@dataclass
class Choice:
    source: ChoiceSource
    config: GemmConfig | None
    reason: str
    record: object | None = None  # the cache record the choice came from
    details: dict[str, Any] = field(default_factory=dict)
    provisional: bool = False  # a tune of this problem was still running elsewhere when chosen
    ranked: list[Any] = field(default_factory=list)  # the model's candidates, best first (predict.Candidate)
    # served under the online guard (guard.py): a prediction, or a record of an older timing protocol
    guarded: bool = False

    def __post_init__(self) -> None:
        self.source = ChoiceSource(self.source)  # (a plain string refused unless it names a source)


def size_class(problem: Problem) -> str:
    outputs = problem.m * problem.n * problem.batch
    if outputs >= LARGE_OUTPUTS:
        return "large"
    if outputs >= MEDIUM_OUTPUTS:
        return "medium"
    return "small"


def default_config(problem: Problem, device: Any) -> GemmConfig | None:
    """The built-in config for a problem nothing was tuned for: those of its size class first, then
    the others (largest first), the first that can run it; None when none can."""
    wanted = size_class(problem)
    defaults = family_for(problem.dtype, problem.compute).defaults(problem)
    ranked = [(cls, config_from_name(name)) for cls, name in defaults]
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


def choose(problem: Problem, device: Any, exact: Any, records: Any) -> Choice:
    """Pure selection over cache contents: `exact` is (record, source) of this problem or None;
    `records` are the device's current records (the model's evidence). `details["candidates"]`
    lists what the model considered, for `explain`."""
    if dtypes.find(problem.dtype, problem.compute) is None:
        return Choice(ChoiceSource.CUBLAS, None, f"no template for {problem.dtype}/{problem.compute} yet: cuBLAS")
    if exact is not None:
        record, source = exact
        where = ChoiceSource.SHIPPED_CACHE if source == "shipped" else ChoiceSource.CACHE
        if record.is_cublas:
            best = record.best_generated
            lost = f"; best generated kernel {best['ratio']:.3f}x" if best else ""
            one_call = best.get("latency_ratio", best.get("single_call_ratio")) if best else None
            if isinstance(one_call, (int, float)):
                lost += f" ({one_call:.3f}x one call at a time)"
            if record.study == "guard":
                lost += " under the online guard"
            return Choice(where, None, f"tuned for this problem: cuBLAS kept{lost} ({record.date[:10]})", record)
        config = record.config_object
        if not config.check(problem, device):
            if not record.current_protocol:  # its ratio may be host time: checked on the first calls
                return Choice(where, config, f"tuned for this problem ({record.ratio:.3f}x cuBLAS on "
                              f"{record.date[:10]}, an older timing protocol: guarded)", record, guarded=True)
            measured_with = record.compiled_by_another_nvrtc
            if measured_with:  # the code measured is not the code served: checked on the first calls
                return Choice(where, config, f"tuned for this problem ({record.ratio:.3f}x cuBLAS on "
                              f"{record.date[:10]}, compiled by NVRTC {measured_with} then and by "
                              f"{nvrtc_release()} here: guarded)", record, guarded=True)
            latency = f", {record.latency_ratio:.3f}x one call at a time" if record.latency_ratio else ""
            return Choice(where, config, f"tuned for this problem ({record.ratio:.3f}x cuBLAS in GPU time{latency} "
                          f"on {record.date[:10]})", record)
    considered = predict.candidates(problem, device, records)
    choice = _choose_untuned(problem, device, considered)
    choice.ranked = considered
    return choice


def _choose_untuned(problem: Problem, device, considered) -> Choice:
    details = {"candidates": [c.to_json() for c in considered[:SHOWN_CANDIDATES]]}
    best = considered[0] if considered else None
    if best is not None and best.wins:
        latency = f", {best.latency_ratio:.3f}x one call at a time" if best.latency_ratio is not None else ""
        return Choice(ChoiceSource.PREDICTED, best.config,
                      f"predicted {best.predicted_ratio:.3f}x cuBLAS in GPU time{latency} "
                      f"(needs {best.needed_ratio:.3f}x) from its {best.measured_ratio:.3f}x on {best.source}; guarded",
                      details=details, guarded=True)
    why = (f"no tuned config is predicted to beat cuBLAS by the margin (best {best.predicted_ratio:.3f}x, "
           f"needs {best.needed_ratio:.3f}x)" if best is not None else "nothing tuned for this dtype on this GPU")
    if (problem.dtype, problem.compute) in CUBLAS_SERVES:
        return Choice(ChoiceSource.CUBLAS, None, f"{why}: cuBLAS", details=details)
    config = default_config(problem, device)
    if config is not None:
        return Choice(ChoiceSource.DEFAULT, config, f"{why}; cuBLAS is not asked to serve {problem.dtype}: built-in "
                      f"{size_class(problem)}-problem configuration", details=details)
    return Choice(ChoiceSource.CUBLAS, None, "no configuration of the template can run this problem: cuBLAS",
                  details=details)


def cublas_api(record: Any) -> str:
    """Which cuBLAS call serves a problem: cuBLASLt with its heuristic (what torch.matmul reaches),
    unless the problem's record measured cublasGemmEx (cupy.matmul's call) faster by GEMMEX_MARGIN in
    GPU time: the heuristic's first choice is not always cuBLAS's best (on an H100, FP16
    2048x11008x4096 ran 6% faster through cublasGemmEx)."""
    baselines = record.baselines if record is not None and record.current_protocol else {}
    lt, gemmex = baselines.get("cublaslt"), baselines.get("cupy.matmul")
    return "gemmex" if lt and gemmex and gemmex < (1 - GEMMEX_MARGIN) * lt else "lt"
