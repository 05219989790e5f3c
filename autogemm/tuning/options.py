"""What a tune is asked for: its budget, sampler and seed, search space, study, and how candidates
are compiled and measured. One dataclass, with the defaults and the checks, that `autogemm tune`,
`autogemm.tune(...)`, campaign files and the tuner share; what a tune works with rather than what
it is asked for (the evaluator, the cache, the progress display, a campaign's sharing) is passed
to `tuner.tune` beside it."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..kernels.space import SearchSpace

SAMPLERS = ("tpe", "random", "grid")  # study.make_sampler makes each
DEFAULT_TRIALS = 400
# The default budget: 30 s of search (startup and the finalists' re-timing come on top: 36 s wall
# for 4096^3 on an H100) or convergence, whichever comes first.
DEFAULT_TIMEOUT_S = 30.0
# Converged: the last PATIENCE measured trials did not raise the best TFLOP/s by more than
# CONVERGED_GAIN (search.converged; PATIENCE 0 never stops it early).
DEFAULT_PATIENCE = 100
CONVERGED_GAIN = 0.005


@dataclass(frozen=True)
class TuneOptions:
    """A tune's options (see `tuner.tune`); ValueError where one is out of its range."""

    trials: int = DEFAULT_TRIALS  # measured candidates of this run, at most
    # seconds of search (the seeds in flight then, and the final re-timing, come on top); None: no limit
    timeout: float | None = DEFAULT_TIMEOUT_S
    patience: int = DEFAULT_PATIENCE  # see DEFAULT_PATIENCE
    seed: int | None = 0  # the sampler's (and the inputs')
    sampler: str = "tpe"  # one of SAMPLERS
    space: SearchSpace | str | Path | None = None  # a space, its TOML file or a shipped name; None: the problem's
    storage: str | None = None  # Optuna storage URL; None: SQLite in the cache directory; ":memory:" keeps nothing
    study_name: str | None = None  # None: from device, problem, space and template version (study_name_for)
    jobs: int | None = None  # compile workers; None: default_jobs()
    seed_configs: bool = True  # start from what is known (the served config, nearby winners, predictions)
    isolate: bool = True  # measure in a separate process, so that a faulting kernel costs one trial
    candidate_timeout: float | None = None  # seconds one isolated candidate may take; None: from its flops

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise ValueError(f"trials must be >= 1, got {self.trials}")
        if self.patience < 0:
            raise ValueError(f"patience must be >= 0, got {self.patience}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {self.sampler!r}; choose from {', '.join(SAMPLERS)}")


OPTION_NAMES = tuple(field.name for field in dataclasses.fields(TuneOptions))


def tune_options(options: TuneOptions | None = None, **values: Any) -> TuneOptions:
    """`options` (the defaults where None) with the options given by name replacing its own:
    how `tune(problem, trials=..., timeout=...)` builds its TuneOptions. TypeError naming the
    options where a name is not one of them."""
    unknown = sorted(set(values) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"unknown tune option(s) {', '.join(unknown)}; the options are {', '.join(OPTION_NAMES)}")
    options = options if options is not None else TuneOptions()
    return dataclasses.replace(options, **values) if values else options


def default_jobs() -> int:
    """Compile workers: one per CPU core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)
