"""The first-call race, off by default (`matmul(..., race=True)` or AUTOGEMM_RACE=1): for a problem
with no record of its own, the model's best few configs and cuBLAS each run on the call's own
operands and the fastest serves that problem for the rest of the process.

Why: the model of `predict` is conservative and extrapolates from other shapes; a race measures
instead of predicting, at the price of one compilation per entrant not compiled before and a few
calls each, once per problem and process. Each entrant writes into its own buffer (never the
caller's `out`), is timed with CUDA events around single calls in alternating rounds (the median of
RACE_ROUNDS), and a kernel whose result differs from cuBLAS's by more than twice the dtype's
tolerance is disqualified.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..measure.bench import time_gpu
from .select import Choice, ChoiceSource

# entrants besides cuBLAS: the model's best-predicted configs
RACE_CONFIGS = 3
# timed calls of each entrant (after one untimed call, which also gives the result checked)
RACE_ROUNDS = 3
CUBLAS = "cublas"


@dataclass
class RaceResult:
    winner: str  # an entrant's name: CUBLAS or a config name
    times_ms: dict[str, float]  # entrant -> median milliseconds per call
    disqualified: dict[str, str] = field(default_factory=dict)  # entrant -> why

    @property
    def margin(self) -> float:
        """cuBLAS's time over the winner's (1.0 when cuBLAS won)."""
        return self.times_ms[CUBLAS] / self.times_ms[self.winner]

    def to_json(self) -> dict[str, Any]:
        return {"winner": self.winner, "times_ms": self.times_ms, "disqualified": self.disqualified,
                "ratio_to_cublas": self.margin}


def run_race(entrants: dict[str, Any], check: Any) -> RaceResult:
    """`entrants`: name -> run() returning its result (CUBLAS among them); `check(result)`: None
    when a result agrees with cuBLAS's, else why not. Every entrant that fails (its compile, its
    launch, its check) is disqualified; cuBLAS cannot be."""
    runs, disqualified = {}, {}
    for name, run in entrants.items():
        if name == CUBLAS:
            runs[name] = run
            continue
        try:
            why = check(run())
        except Exception as exc:  # noqa: BLE001 - an entrant that cannot run is out, the call goes on
            why = f"{type(exc).__name__}: {exc}"
        if why:
            disqualified[name] = why
        else:
            runs[name] = run
    entrants[CUBLAS]()  # warm, like the others
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(RACE_ROUNDS):  # rounds alternate the entrants; each call timed alone
        for name, run in runs.items():
            times[name].append(time_gpu(lambda _: run(), warmup=0, repeats=1).median_ms)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    winner = min(medians, key=lambda name: (medians[name], name != CUBLAS))  # a tie goes to cuBLAS
    return RaceResult(winner, medians, disqualified)


def race_choice(choice: Choice, result: RaceResult) -> Choice:
    """The choice a race made, keeping the model's candidates and the race's figures for `explain`."""
    details = dict(choice.details, race=result.to_json())
    raced = len(result.times_ms) + len(result.disqualified)
    if result.winner == CUBLAS:
        reason = f"raced {raced} entrants on the first call: cuBLAS won ({result.times_ms[CUBLAS]:.4f} ms)"
        return Choice(ChoiceSource.RACE, None, reason, details=details, ranked=choice.ranked)
    config = next(c.config for c in choice.ranked if c.config.name == result.winner)
    reason = (f"raced {raced} entrants on the first call: {result.margin:.3f}x cuBLAS "
              f"({result.times_ms[result.winner]:.4f} vs {result.times_ms[CUBLAS]:.4f} ms)")
    return Choice(ChoiceSource.RACE, config, reason, details=details, ranked=choice.ranked)
