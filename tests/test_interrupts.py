"""A Ctrl-C whose KeyboardInterrupt lands in a garbage collector's callback, where Python drops it, still
stops what checks for it (autogemm/interrupts.py): a campaign worker under load once tuned on to the
end through such a stop."""

from __future__ import annotations

import os
import signal
import sys
import threading
import weakref

import pytest

from autogemm import interrupts


def test_a_ctrl_c_dropped_in_a_weakref_callback_is_still_seen(monkeypatch):
    monkeypatch.setattr(interrupts, "_requested", threading.Event())
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(unraisable.exc_type))
    previous = signal.getsignal(signal.SIGINT)
    interrupts.install()
    try:
        class Thing:
            pass

        thing = Thing()

        def callback(_):  # SIGINT arrives while the callback runs: its KeyboardInterrupt is dropped
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass

        reference = weakref.ref(thing, callback)
        del thing
        assert reference() is None
        assert dropped == [KeyboardInterrupt]  # Python dropped it: without the record, the stop is lost
        assert interrupts.requested()
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_check_is_silent_without_a_ctrl_c(monkeypatch):
    monkeypatch.setattr(interrupts, "_requested", threading.Event())
    interrupts.check()
    assert not interrupts.requested()
