"""What a tune shows while it runs: a tqdm bar of measured trials with the best TFLOP/s, its ratio
to cuBLAS, and the rejected and failed counts so far."""

from __future__ import annotations

from .evaluate import Evaluator
from .problem import Problem


class TuneProgress:
    """tqdm bar of measured trials with the best TFLOP/s and ratio to cuBLAS so far."""

    def __init__(self, enabled, total: int, problem: Problem, evaluator: Evaluator):
        # `enabled` may be a callable instead of True: it gets (measured trials, best TFLOP/s, ratio
        # to cuBLAS) after each trial, and no bar is drawn (a campaign worker reports to its parent)
        self.bar = None
        self.problem, self.evaluator = problem, evaluator
        self.callback = enabled if callable(enabled) else None
        self.measured = 0
        if enabled and self.callback is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="trial", desc=f"tuning {problem}", dynamic_ncols=True)

    def update(self, measured: bool, best_ms: float | None, rejected: int, failed: int) -> None:
        self.measured += measured
        if self.callback is not None and best_ms:
            self.callback(self.measured, self.problem.flops / best_ms / 1e9, self.evaluator.cublas_ms / best_ms)
        if not self.bar:
            return
        if measured:
            self.bar.update(1)
        if best_ms:
            tflops = self.problem.flops / best_ms / 1e9
            self.bar.set_postfix_str(
                f"best {tflops:.1f} TFLOP/s = {self.evaluator.cublas_ms / best_ms:.3f}x cuBLAS, "
                f"rejected {rejected}, failed {failed}"
            )

    def close(self) -> None:
        if self.bar:
            self.bar.close()
