"""Where this process's id means something: its boot and its PID namespace, beside the host name.
Containers that share a host name do not see each other's processes, and a reboot reuses ids, so a
process id from a file (a claim's owner, a temporary file's name) says whether that process is dead
only where both match this process's."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path


@functools.lru_cache(maxsize=1)
def identity() -> tuple[str, str]:
    """(boot id, PID namespace number) of this process; empty strings where they cannot be read (not
    Linux)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return "", ""
    found = re.search(r"\d+", namespace)
    if not re.fullmatch(r"[0-9a-fA-F-]{8,64}", boot) or found is None:
        return "", ""
    return boot, found.group()
