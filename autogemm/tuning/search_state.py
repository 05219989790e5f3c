"""What one study's search (search.SearchLoop) keeps as it goes: its counts, the candidates it has in flight,
and the test that says its best has stopped improving."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .options import CONVERGED_GAIN


@dataclass
class SearchCounters:
    """What a search has done so far, as its result and its cached records report it."""

    valid: int = 0  # candidates measured here
    rejected: int = 0  # proposals that break the space's rules or the config's check (pruned, never compiled)
    failed: int = 0  # candidates that failed: compile, launch, wrong result...
    duplicates: int = 0  # proposals of a configuration measured, failed or in flight already
    measured_elsewhere: int = 0  # configurations other workers measured into the study meanwhile
    seeded: int = 0  # known configurations enqueued before the search
    idle_proposals: int = 0  # proposals in a row that measured nothing new
    consecutive_failures: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # failed candidates per failure kind
    history: list[float] = field(default_factory=list)  # TFLOP/s of the candidates measured here, in order

    @property
    def measured(self) -> int:
        """What `trials` counts: configurations measured in this run, here or by other workers."""
        return self.valid + self.measured_elsewhere

    def for_record(self) -> dict[str, Any]:
        """The counts a cached record carries (Record.trials)."""
        return {"valid": self.valid, "rejected": self.rejected, "failed": self.failed}


@dataclass
class InFlight:
    """A candidate compiling or waiting for the GPU, with the trials that proposed it."""

    config: object
    trials: list[Any]
    handle: object  # the evaluator's


def converged(history: list[float], patience: int) -> bool:
    """Whether the search has converged: the best of `history` (TFLOP/s of the measured trials, in
    order) beats the best before its last `patience` trials by no more than CONVERGED_GAIN."""
    if patience <= 0 or len(history) <= patience:
        return False
    return max(history) <= (1 + CONVERGED_GAIN) * max(history[:-patience])
