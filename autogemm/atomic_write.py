"""Writing a file so that readers see the old content or the new, never half, and so that what a
killed writer leaves behind is cleaned up by the next one.

The new content goes to a temporary file in the same directory (so that the rename is atomic),
is fsynced, renamed over the target, and the directory fsynced (so that the rename survives a
power cut). A temporary file is named after its target, host, PID namespace and process:
``.<target>.<host>.<namespace>.<pid>.<8 hex digits>.tmp``; a process killed with -9 cannot remove its
own, so every write first removes those of its target whose process is dead (this host's and PID
namespace's: a container sharing the host name sees other processes), or that are older than a day
(another host's or namespace's, on a shared directory). Only names of exactly that form are touched
(and the form of earlier versions, without the namespace, by age): a user's own ``.<target>.notes.tmp``
is not ours. Files are readable by all (0644), so that a team can share a cache directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
import time
from pathlib import Path

from .host_identity import identity

FILE_MODE = 0o644
# another host's temporary file this old is left over, whatever its process (no write takes a day)
ORPHAN_AGE_S = 24 * 3600
# at most this much of the host name goes into a temporary file's name (file names stop at 255 bytes)
HOST_CHARS = 32


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname())[:HOST_CHARS] or "host"


def _namespace() -> str:
    return identity()[1] or "0"


def temporary_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{_host()}.{_namespace()}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _ours(path: Path, name: str) -> re.Match | None:
    """The parts of `name` where it is a temporary file `temporary_path` gives `path` (or gave before the
    namespace was part of it); None for any other name."""
    return re.fullmatch(rf"\.{re.escape(path.name)}\.(?P<host>[A-Za-z0-9-]{{1,{HOST_CHARS}}})\."
                        r"(?:(?P<namespace>\d{1,20})\.)?(?P<pid>\d{1,10})\.[0-9a-f]{8}\.tmp", name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # someone else's process (or no id a process has): not ours
        return True
    return True


def remove_orphans(path: Path) -> list[Path]:
    """Removes the temporary files of `path` that killed writers left; returns them."""
    removed = []
    try:
        candidates = [(p, match) for p in path.parent.iterdir() if (match := _ours(path, p.name))]
    except OSError:  # no directory yet, or one we may not list: nothing of ours to clean
        return removed
    now = time.time()
    for candidate, match in candidates:
        pid = int(match["pid"])
        try:
            # this host's and PID namespace's, of a dead process; else (another host's or namespace's,
            # a reused process id, a name earlier versions gave) only once older than any write takes
            here = match["host"] == _host() and match["namespace"] == _namespace()
            dead = here and pid != os.getpid() and not _alive(pid)
            if dead or now - candidate.stat().st_mtime > ORPHAN_AGE_S:
                candidate.unlink()
                removed.append(candidate)
        except OSError:  # gone meanwhile (another writer cleaned it), or not ours to remove
            continue
    return removed


def _fsync_directory(folder: Path) -> None:
    with contextlib.suppress(OSError):  # (some file systems cannot open or sync a directory)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replaces `path` with `data` atomically (see the module's docstring). On any failure (a full
    disk, say) the old file stays and no temporary file is left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path)
    tmp = temporary_path(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(out.fileno(), FILE_MODE)  # whatever the umask
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
