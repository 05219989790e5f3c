"""What a tune shows while it runs: a tqdm bar of measured trials with the best TFLOP/s, its ratio
to cuBLAS, and the rejected and failed counts so far; where stderr is not a terminal (a log file,
CI), a line of the same every LOG_INTERVAL_S seconds instead of a bar redrawn in place."""

from __future__ import annotations

import sys
import time
from typing import Any

from ..measure.evaluate import Evaluator
from ..problem import Problem

LOG_INTERVAL_S = 10.0


class TuneProgress:
    """tqdm bar (or log lines) of measured trials with the best TFLOP/s and ratio to cuBLAS so far."""

    def __init__(self, enabled: Any, total: int, problem: Problem, evaluator: Evaluator, stream: Any = None):
        # `enabled` may be a callable instead of True: it gets (measured trials, best TFLOP/s, ratio
        # to cuBLAS) after each trial, and nothing is drawn (a campaign worker reports to its parent)
        self.bar = None
        self.problem, self.evaluator, self.total = problem, evaluator, total
        self.callback = enabled if callable(enabled) else None
        self.measured = 0
        self.stream = stream or sys.stderr
        shown = bool(enabled) and self.callback is None
        self.log = shown and not self.stream.isatty()
        self.started = self.logged = time.monotonic()
        self.status = ""
        if shown and not self.log:
            from tqdm import tqdm  # (lazy: only progress display needs it)

            self.bar = tqdm(total=total, unit="trial", desc=f"tuning {problem}", dynamic_ncols=True, file=self.stream)
        elif self.log:
            print(f"tuning {problem}: up to {total} trials", file=self.stream, flush=True)

    def update(self, measured: bool, best_ms: float | None, rejected: int, failed: int) -> None:
        self.measured += measured
        if self.callback is not None and best_ms:
            self.callback(self.measured, self.problem.flops / best_ms / 1e9, self.evaluator.cublas_ms / best_ms)
        if best_ms:
            tflops = self.problem.flops / best_ms / 1e9
            self.status = (f"best {tflops:.1f} TFLOP/s = {self.evaluator.cublas_ms / best_ms:.3f}x cuBLAS, "
                           f"rejected {rejected}, failed {failed}")
        if self.log and time.monotonic() - self.logged >= LOG_INTERVAL_S:
            self._log_line()
        if not self.bar:
            return
        if measured:
            self.bar.update(1)
        if best_ms:
            self.bar.set_postfix_str(self.status)

    def _log_line(self) -> None:
        self.logged = time.monotonic()
        print(f"tuning {self.problem}: {self.measured}/{self.total} trials, {self.logged - self.started:.0f} s"
              + (f", {self.status}" if self.status else ""), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar:
            self.bar.close()
        elif self.log:
            self._log_line()
