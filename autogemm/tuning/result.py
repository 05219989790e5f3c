"""What a tuning run found and how it went: `TuneResult`, returned by `autogemm.tune` and printed
by `autogemm tune` (as a table, or as JSON with `to_json`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..problem import Device, Problem
from ..results.url_secrets import shown_url


class TuneError(RuntimeError):
    pass


class TuneStorageError(TuneError):
    """The study storage could not be opened: nothing is wrong with the problem, which a later run
    (the storage back) can tune."""


class TuneRunning(TuneError):
    """Another tuner is running this study on this machine (`study`: its name)."""

    def __init__(self, message: str, study: str):
        super().__init__(message)
        self.study = study


@dataclass
class TuneResult:
    problem: Problem
    device: Device
    config: object
    time_ms: float
    tflops: float
    rel_error: float | None
    cublas_ms: float
    valid: int  # measured trials of this run
    rejected: int  # pruned by the space's constraints or check(), never compiled
    failed: int  # compile / launch / wrong / crash ...
    duplicates: int  # proposals of an already measured config (answered from the study)
    study_trials: int  # measured trials in the study, earlier runs included
    wall_s: float
    study_name: str
    storage: str
    cache_path: str | None
    interrupted: bool
    history: list[float] = field(default_factory=list)  # TFLOP/s of each measured trial, in order
    failures: dict[str, int] = field(default_factory=dict)
    stopped: str = ""  # why the search ended before its trials (converged, Ctrl-C, a lost GPU context)
    restarts: int = 0  # measuring-process restarts after crashes and timeouts
    restart_s: float = 0.0
    cache_error: str = ""  # why the result could not be cached (a read-only or full cache), if it could not
    unstored_kernels: int = 0  # compiled kernels the disk would not take (measured from memory)
    storage_error: str = ""  # why
    # True when no generated kernel beat cuBLAS by more than `noise`: cuBLAS is what was cached and
    # what matmul serves; `config` and `ratio` are then the best generated kernel's
    kept_cublas: bool = False
    noise: float = 0.0  # relative spread of the final cuBLAS timings
    seeded: int = 0  # configs enqueued from what was known (cache, model) before the search
    # the best generated kernel's and the served cuBLAS fallback's single-call latency
    # (evaluate.Latency; None: not measured, an interrupted tune)
    latency: object = None
    # where several spaces were searched (tune without a space): (study, family, best generated
    # kernel's ratio, measured trials, kept cuBLAS) of each, in the order searched
    searched: list[Any] = field(default_factory=list)
    unsearched: list[Any] = field(default_factory=list)  # spaces in which nothing could be measured, and why
    # where the final comparison was timed sustained: Record.sustained's figures (clock, power, rounds,
    # the short re-timings' ratio); time_ms and cublas_ms are then sustained GPU times
    sustained: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the result is printed and kept (tables, JSON, a campaign's board): never a password
        if self.storage:
            self.storage = shown_url(self.storage)

    @property
    def single_call_ratio(self) -> float | None:
        """The served cuBLAS fallback's latency over the best generated kernel's (> 1: it is faster)."""
        return self.latency.ratio if self.latency is not None else None

    @property
    def kept_reason(self) -> str:
        """Why cuBLAS was kept, in figures ("" when it was not)."""
        if not self.kept_cublas:
            return ""
        if self.single_call_ratio is not None and self.ratio > 1 + self.noise:
            if self.sustained:
                return (f"best generated kernel {self.ratio:.3f}x in sustained GPU time but {self.single_call_ratio:.3f}x "
                        f"one call at a time, beyond the noise")
            return (f"best generated kernel {self.ratio:.3f}x in GPU time but {self.single_call_ratio:.3f}x "
                    f"one call at a time")
        return f"best generated kernel {self.ratio:.3f}x"

    @property
    def cublas_tflops(self) -> float:
        return self.problem.flops / self.cublas_ms / 1e9

    @property
    def ratio(self) -> float:
        return self.cublas_ms / self.time_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "problem": self.problem.key,
            "device": self.device.name,
            "config": self.config.name,
            "knobs": self.config.to_dict(),
            "time_ms": self.time_ms,
            "tflops": self.tflops,
            "cublas_ms": self.cublas_ms,
            "cublas_tflops": self.cublas_tflops,
            "ratio": self.ratio,
            "rel_error": self.rel_error,
            "trials": {"valid": self.valid, "rejected": self.rejected, "failed": self.failed,
                       "duplicates": self.duplicates, "in_study": self.study_trials},
            "failures": self.failures,
            "wall_s": self.wall_s,
            "study": self.study_name,
            "storage": self.storage,
            "cache": self.cache_path,
            "interrupted": self.interrupted,
            "stopped": self.stopped,
            "restarts": self.restarts,
            "restart_s": self.restart_s,
            "cache_error": self.cache_error,
            "kept_cublas": self.kept_cublas,
            "noise": self.noise,
            "seeded": self.seeded,
            "single_call_ratio": self.single_call_ratio,
            "latency_us": self.latency.kernel_us if self.latency is not None else None,
            "baseline_latency_us": self.latency.baseline_us if self.latency is not None else None,
            "searched": [{"study": study, "family": family, "ratio": ratio, "valid": valid, "kept_cublas": kept}
                         for study, family, ratio, valid, kept in self.searched],
            "unsearched": self.unsearched,
            "sustained": self.sustained,
            "unstored_kernels": self.unstored_kernels,
            "storage_error": self.storage_error,
        }
