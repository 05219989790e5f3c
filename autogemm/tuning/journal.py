"""Optuna's journal file storage (`journal:///PATH`), the campaigns' default, as autogemm opens it: one
JournalStorage per file and process, appended to only where the file is a journal, and never after
a partial line.

A journal is a log of JSON lines. A write cut short (a full disk, a killed process) leaves a last line
without its newline; Optuna's next append would join it, and from then on every open of the journal
fails on that line (JSONDecodeError), so every worker skips every problem on every run. Here each
append first cuts a partial last line (its write never completed) and a failed append takes back
what it wrote, both under the journal's own lock (the one Optuna's backend takes). A journal that is
already broken before its end is moved aside whole (`<name>.corrupt-<time>`) and its lines before
the break kept as the journal, with a warning: a prefix of a journal is a journal. A file that is not
a journal at all is refused: nothing is appended to it.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from ..atomic_write import write_atomically

JOURNAL = "journal:///"  # Optuna's journal file storage: journal:///path/to/studies.log
_TAIL_BLOCK = 1 << 16  # bytes read at a time from the end when looking for the last newline


class JournalError(RuntimeError):
    """A file named as a journal storage that is not one (or cannot be read as one)."""


class JournalWarning(UserWarning):
    """A broken journal was moved aside and its readable part kept."""


_JOURNALS: dict[str, object] = {}  # journal file -> its JournalStorage, one per process
_JOURNALS_LOCK = threading.Lock()


def _is_entry(line: bytes) -> bool:
    try:
        entry = json.loads(line)
    except ValueError:  # (JSONDecodeError and a line that is not UTF-8)
        return False
    return isinstance(entry, dict) and "op_code" in entry


def _complete_length(file, size: int) -> int:
    """The length of `file` (binary, readable) up to and with its last newline: 0 where it has none."""
    end = size
    while end > 0:
        start = max(0, end - _TAIL_BLOCK)
        file.seek(start)
        block = file.read(end - start)
        newline = block.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def _mend(path: Path) -> None:
    """Under the journal's lock, before the first use in this process: JournalError where `path` is
    not a journal; a partial last line cut; lines after a broken one moved aside with the whole file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise JournalError(f"cannot read the journal {path}: {exc}") from None
    if not data:
        return
    lines = data.split(b"\n")
    complete, partial = lines[:-1], lines[-1]
    if not _is_entry(complete[0] if complete else partial):
        raise JournalError(f"{path} is not an Optuna journal (its first line is not a journal entry); autogemm "
                           "appends only to a journal: name a new file, or move this one away")
    broken = next((i for i, line in enumerate(complete) if not _is_entry(line)), None)
    if broken is None:
        if partial:  # a write that never completed: cut it, so that the next append starts a line
            os.truncate(path, len(data) - len(partial))
        return
    aside = path.with_name(f"{path.name}.corrupt-{datetime.datetime.now():%Y%m%d-%H%M%S-%f}")
    # the whole file kept aside first, then its readable prefix over it: the path is a journal throughout
    write_atomically(aside, data)
    write_atomically(path, b"".join(line + b"\n" for line in complete[:broken]))
    warnings.warn(f"autogemm: the journal {path} was broken at line {broken + 1} of {len(lines)} (a write cut "
                  f"short); moved it to {aside} and kept its first {broken} lines as the journal", JournalWarning,
                  stacklevel=4)


def _backend_class():
    from optuna.storages.journal import JournalFileBackend  # (lazy: Optuna)

    class MendingBackend(JournalFileBackend):
        """Optuna's file backend, whose appends never follow a partial line nor leave one."""

        def __init__(self, path: str, lock) -> None:
            super().__init__(path, lock)
            # (names of our own: the base class's attributes are Optuna's)
            self._journal_path, self._journal_lock = path, lock

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            text = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode()
            self._journal_lock.acquire()
            try:
                with open(self._journal_path, "a+b") as file:
                    size = os.fstat(file.fileno()).st_size
                    start = _complete_length(file, size) if size else 0
                    if start != size:  # another writer's write was cut short: its partial line goes
                        file.truncate(start)
                    try:
                        file.write(text)
                        file.flush()
                        os.fsync(file.fileno())
                    except OSError:
                        file.truncate(start)  # (a full disk: what did get written goes, the journal stays whole)
                        raise
            finally:
                self._journal_lock.release()

    return MendingBackend


def journal_storage(url: str) -> Any:
    """The JournalStorage of `journal:///PATH` for this process (made once per file: a new one reads
    the whole log again); the file checked and mended under its lock when it is first opened here.
    JournalError where it is not a journal."""
    from optuna.storages.journal import JournalFileSymlinkLock, JournalStorage  # (lazy: Optuna)

    path = Path(url[len(JOURNAL):])
    if not path.name or path.is_dir():
        raise JournalError("a journal storage must name a file")
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(path.resolve())
    with _JOURNALS_LOCK:
        storage = _JOURNALS.get(key)
        if storage is None or not path.exists():  # (a log removed meanwhile starts afresh)
            lock = JournalFileSymlinkLock(str(path))
            lock.acquire()
            try:
                _mend(path)
            finally:
                lock.release()
            storage = _JOURNALS[key] = JournalStorage(_backend_class()(str(path), lock))
        return storage
