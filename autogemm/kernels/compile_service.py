"""One compile pool for every GPU worker of a campaign.

Compiling is the CPU side of tuning and comes in bursts: while one GPU's tune re-times its
finalists or starts its measuring process, another's may have eight candidates waiting. So the
campaign's parent keeps one pool of compile processes sized to the host's cores (spawned: they hold
no GPU context), and each worker process sends it its compile requests over a pipe
(`CompileService.connect`), through a stand-in for a local pool (`RemoteCompilePool`) that the
tuner's evaluator takes like its own. Results come back as futures; a compile error comes back as
itself; a compile process that dies fails the requests it held with BrokenProcessPool (as a local
pool would), and the next request gets a fresh pool.
"""

from __future__ import annotations

import multiprocessing
import itertools
import pickle
import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .compile import compile_pool


def _sendable(exc: BaseException) -> BaseException:
    """The exception itself where it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class CompileService:
    """In the campaign's parent: the shared pool, and a thread per connected worker."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self._pool = compile_pool(jobs)
        self._lock = threading.Lock()

    def connect(self) -> Any:
        """A new worker's end of a pipe to the service (pass it to the worker process)."""

        ours, theirs = multiprocessing.get_context("spawn").Pipe()
        threading.Thread(target=self._serve, args=(ours,), name="autogemm-compile-service", daemon=True).start()
        return theirs

    def _submit(self, function, args) -> Future:
        with self._lock:
            try:
                return self._pool.submit(function, *args)
            except BrokenProcessPool:  # a compile process died since the last request: a fresh pool
                self._pool = compile_pool(self.jobs)
                return self._pool.submit(function, *args)

    def _serve(self, conn) -> None:
        sending = threading.Lock()

        def reply(ident: int, future: Future) -> None:
            try:
                answer = (ident, True, future.result())
            except BaseException as exc:  # the worker decides what a failure means
                answer = (ident, False, _sendable(exc))
            with sending:
                try:
                    conn.send(answer)
                except (OSError, EOFError):  # the worker is gone
                    pass

        while True:
            try:
                ident, function, args = conn.recv()
            except (EOFError, OSError):
                return
            try:
                future = self._submit(function, args)
            except Exception as exc:
                future = Future()
                future.set_exception(exc)
            future.add_done_callback(lambda done, ident=ident: reply(ident, done))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class RemoteCompilePool:
    """In a worker: submit() like a ProcessPoolExecutor's, served by the parent's CompileService.
    shutdown() leaves the shared pool alone (it outlives each tune)."""

    def __init__(self, conn: Any):
        self._conn = conn
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._broken = False
        threading.Thread(target=self._read, name="autogemm-compile-replies", daemon=True).start()

    def submit(self, function: Any, *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._broken:
                raise BrokenProcessPool("the campaign's compile service is gone")
            ident = next(self._ids)
            self._pending[ident] = future
            try:
                self._conn.send((ident, function, args))
            except (OSError, EOFError) as exc:
                del self._pending[ident]
                self._broken = True
                raise BrokenProcessPool(f"the campaign's compile service is gone ({exc})") from None
        return future

    def _read(self) -> None:
        while True:
            try:
                ident, ok, value = self._conn.recv()
            except (EOFError, OSError):
                with self._lock:
                    self._broken = True
                    pending, self._pending = self._pending, {}
                for future in pending.values():
                    if not future.done():
                        future.set_exception(BrokenProcessPool("the campaign's compile service is gone"))
                return
            with self._lock:
                future = self._pending.pop(ident, None)
            if future is None:
                continue
            try:
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
            except InvalidStateError:  # cancelled by the tuner meanwhile (a candidate it dropped)
                pass

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass
