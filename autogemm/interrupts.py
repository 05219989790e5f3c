"""Ctrl-C that is not lost. A SIGINT handler raises KeyboardInterrupt wherever the main thread is; where
that is a weakref callback or a `__del__` (the garbage collector runs them at any moment), Python
prints "Exception ignored in ..." and drops the exception, and the process goes on as if no Ctrl-C
had come. A campaign worker under load lost its stop so, and tuned to the end. The handler here also
records the request, and long loops call `check()` at points where stopping is safe, which raises it
again.
"""

from __future__ import annotations

import signal
import threading

_requested = threading.Event()


def _handler(signum, frame):
    _requested.set()
    raise KeyboardInterrupt


def install() -> None:
    """SIGINT raises KeyboardInterrupt and is remembered (main thread only, as every signal handler)."""
    signal.signal(signal.SIGINT, _handler)


def requested() -> bool:
    return _requested.is_set()


def check() -> None:
    """KeyboardInterrupt where a SIGINT came since `install` (whether or not its first raise got through)."""
    if _requested.is_set():
        raise KeyboardInterrupt
