"""The online guard: no shape stays slow. A kernel that serves a problem without having been measured
against the baseline on it under the current protocol (a prediction, or a record of an older
protocol) is compared with the served cuBLAS fallback on the user's own operands during its first
calls, and dropped for the process if it loses.

How: the first 2·GUARD_CALLS calls alternate between the kernel and the fallback (both compute the
same product, so every call's result is right), each between two CUDA events on the call's stream.
Nothing waits for them: a later call asks the last event whether it is done (cudaEventQuery) and,
once it is, compares the medians and puts the winner in the plan's place; until then the fallback
serves. The events time each call as the user's loop runs it: GPU time when calls queue behind each
other, host time included when the GPU waits for the host. A kernel that does not beat the fallback
by GUARD_MARGIN loses; the loss is remembered in the user cache (`remember_loss`), so the next
process serves cuBLAS for that problem without guarding again. Once decided, the plan calls the
winner's launcher directly: the guard costs nothing more.
"""

from __future__ import annotations

import statistics
import threading
import warnings
from typing import Any

from ..gpu.capture import capturing
from ..kernels.render import kernel_digest, kernel_template_hash
from ..results.cache import CUBLAS, CacheWarning, Record
from ..results.provenance import host, now, runtime_versions

GUARD_CALLS = 4  # timed calls of each side
GUARD_MARGIN = 0.02  # the kernel must be this much faster than the fallback to stay


class Guard:
    """A launcher (`launch(pa, pb, pc, alpha, beta, stream=None)`) that guards `kernel` against
    `fallback` and then hands the plan to the winner through `settle(launcher, verdict)`."""

    def __init__(self, kernel: Any, fallback: Any, settle: Any, calls: int = GUARD_CALLS, margin: float = GUARD_MARGIN):
        import cupy  # (lazy: CuPy)

        self._kernel, self._fallback, self._settle = kernel, fallback, settle
        self._events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(2 * calls)]
        self._current_stream = cupy.cuda.get_current_stream
        self._elapsed = cupy.cuda.get_elapsed_time
        self._margin = margin
        self._calls = 0
        self._lock = threading.Lock()
        self.verdict: dict[str, Any] | None = None

    def __call__(self, pa: Any, pb: Any, pc: Any, alpha: Any, beta: Any, stream: Any = None) -> Any:
        where = stream if stream is not None else self._current_stream()
        if capturing(where.ptr):  # a graph's call is neither timed nor waited on: the fallback serves it
            return self._fallback(pa, pb, pc, alpha, beta, stream)
        with self._lock:
            index = self._calls
            if index < len(self._events):
                self._calls += 1
                launcher = self._kernel if index % 2 == 0 else self._fallback
                start, stop = self._events[index]
                start.record(where)
                launcher(pa, pb, pc, alpha, beta, stream)
                stop.record(where)
                return None
            if self.verdict is None and self._events[-1][1].done:
                self._decide()
        winner = self._kernel if self.verdict and self.verdict["kernel_won"] else self._fallback
        return winner(pa, pb, pc, alpha, beta, stream)

    def _decide(self) -> None:
        kernel_ms = [self._elapsed(*self._events[i]) for i in range(0, len(self._events), 2)]
        fallback_ms = [self._elapsed(*self._events[i]) for i in range(1, len(self._events), 2)]
        kernel, fallback = statistics.median(kernel_ms), statistics.median(fallback_ms)
        self.verdict = {"kernel_ms": kernel, "fallback_ms": fallback, "ratio": fallback / kernel,
                        "kernel_won": kernel * (1 + self._margin) < fallback}
        self._settle(self._kernel if self.verdict["kernel_won"] else self._fallback, self.verdict)


def remember_loss(cache: Any, device: Any, problem: Any, config: Any, verdict: dict[str, Any]) -> None:
    """Files a cuBLAS record for `problem` in the user cache: `config` lost to cuBLAS under the guard
    (the figures are the guard's, not a tune's: the record says so in `study` and carries protocol 1,
    so it is never evidence for the predictor, and any tune of the problem replaces it). A cache that
    cannot be written is passed over: the process has dropped the kernel all the same."""
    ms = verdict["fallback_ms"]
    tflops = problem.flops / ms / 1e9
    best = {"family": config.family, "config": {k: v for k, v in config.to_dict().items() if k != "family"},
            "config_name": config.name, "ratio": verdict["ratio"], "tflops": problem.flops / verdict["kernel_ms"] / 1e9}
    record = Record(problem=problem.key, family=CUBLAS, config={}, config_name=CUBLAS, time_ms=ms, tflops=tflops,
                    cublas_ms=ms, cublas_tflops=tflops, ratio=1.0, rel_error=float("nan"),
                    template_hash=kernel_template_hash(config.template), device=device.name,
                    versions=runtime_versions(), date=now(), host=host(), study="guard", best_generated=best,
                    source_digest=kernel_digest(config, problem), protocol=1)
    try:
        cache.store(record, device.slug, keep_better=False)
    except OSError as exc:
        warnings.warn(f"autogemm: cannot remember in {cache.directory} that {config.name} lost to cuBLAS on "
                      f"{problem} ({exc})", CacheWarning, stacklevel=2)
