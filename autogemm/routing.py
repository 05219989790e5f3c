"""How the rows of a grouped product (a mixture-of-experts layer's tokens, sorted by expert) fall to its
groups: the buckets a grouped problem is tuned for, and the counts that stand for each bucket.

- "uniform": every group the same count, give or take one (a balanced router);
- "skewed": counts falling as 1/rank^1.2, the ranks shuffled so that the heavy groups are not all first
  (some groups get none where rows are few).

A grouped problem's key names its bucket (`Problem.routing`), because a kernel's speed depends on it: the
groups' row tiles are what the persistent blocks share out. The serving layer cannot see the routing of a
call without reading the offsets on the host, so it serves a tuned kernel only where both buckets' tunes
kept it (`serving/grouped_plan.py`), unless the caller names the bucket.
"""

from __future__ import annotations

import numpy as np

ROUTINGS = ("uniform", "skewed")
SKEW = 1.2  # the skewed bucket's exponent


def counts_for(groups: int, rows: int, routing: str) -> list[int]:
    """Rows per group, summing to `rows`, of the bucket `routing` (deterministic: the same every call)."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    if groups < 1 or rows < 0:
        raise ValueError(f"counts of {rows} rows over {groups} groups: need groups >= 1 and rows >= 0")
    if routing == "uniform":
        weights = np.ones(groups)
    else:  # the ranks shuffled by a generator seeded with the group count: the same counts every call
        weights = 1.0 / np.arange(1, groups + 1) ** SKEW
        np.random.default_rng(groups).shuffle(weights)
    counts = np.floor(weights / weights.sum() * rows).astype(int)
    counts[np.argsort(-weights, kind="stable")[: rows - counts.sum()]] += 1  # the remainder to the heaviest
    return [int(c) for c in counts]


def offsets_for(groups: int, rows: int, routing: str) -> list[int]:
    """The groups' E + 1 row offsets (from 0 to `rows`) of the bucket `routing`."""
    offsets = [0]
    for count in counts_for(groups, rows, routing):
        offsets.append(offsets[-1] + count)
    return offsets
