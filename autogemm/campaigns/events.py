"""What a campaign's workers tell the process that runs them: each event is a tuple (WorkerEvent,
worker label, *details) on the campaign's queue; `worker.py` puts them, `campaign.run_campaign`
hands them to its view (`autogemm campaign run` shows them). A WorkerEvent is its string (the
strings events have always been), so that what compares an event with its string still reads it."""

from __future__ import annotations

from enum import StrEnum


class WorkerEvent(StrEnum):
    """The kinds of worker event, each with the details that follow the worker's label."""

    READY = "ready"  # (device name, owner): registered on the board, about to claim
    START = "start"  # (problem key): tuning a problem it claimed
    TRIAL = "trial"  # (problem key, measured trials, best TFLOP/s, ratio to cuBLAS): a tune's progress
    DONE = "done"  # (problem key, summary): tuned, or found finished in the campaign's cache
    HELPING = "helping"  # (problem key, study name): nothing left to claim; searching another GPU's study
    FAILED = "failed"  # (problem key, reason): nothing measurable; done, with the reason
    SKIPPED = "skipped"  # (problem key, reason): given back (study busy, storage failing), or not helped
    STOPPED = "stopped"  # (problem key or "", reason): interrupted; the claim goes back
    LOST = "lost"  # (problem key, reason): the claim was taken over meanwhile; the result is cached
    ERROR = "error"  # (message): the worker failed
