"""The store of tuned results: one JSON document per device, entries keyed by the problem.

Documents live in ``<cache dir>/tuned/<device-slug>.json`` (the user's, written by tuning) and in
the tuned results shipped with autogemm (read after the user's). Writes are atomic (atomic_write.py:
temporary file + rename, fsynced, mode 0644 so that a team can share the directory, what a killed
writer left removed by the next) under a file lock, so concurrent tuners lose nothing; reads take
no lock, so a read-only cache (a shared mount) serves read-only. An import writes each device's
document once. Nothing read from a file is trusted: a document that is not one (not JSON, nested
deeper than any document autogemm writes, a key given twice: strict_json.py) is moved aside (or
ignored where it cannot be moved), and every record is validated (types, ranges, figures a GPU can
reach, a config some family reads) before use; a bad one is skipped with a warning naming the file
and the key. Device names become file names only in the form `Device.slug` gives them. A record
whose template hash differs from its kernel template's today is ignored by lookups and shown as
stale by listings.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic_write import FILE_MODE, write_atomically
from ..paths import shipped_cache_dir, user_cache_dir
from ..problem import Problem
# the records themselves, named here too: most callers know them as the cache's
from .record import CUBLAS, Record, cublas_record, filed_record, shown_value  # noqa: F401
from .strict_json import loads

if TYPE_CHECKING:
    from filelock import FileLock

FORMAT = 1
# the form Device.slug gives a device's name: lowercase letters and digits in hyphenated words
DEVICE_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
# The longest slug taken: a GPU's name is a few words, and the files named after it (its document,
# lock, temporary and set-aside files) must stay within the 255 bytes a file name may have.
MAX_SLUG_LENGTH = 128


class CacheWarning(UserWarning):
    pass


class CacheWriteError(OSError):
    """The cache directory refused a write; the message says what had been written before."""


def is_slug(slug: str) -> bool:
    return isinstance(slug, str) and len(slug) <= MAX_SLUG_LENGTH and DEVICE_SLUG.fullmatch(slug) is not None


def check_slug(slug: str) -> str:
    """`slug` if it is a device slug (so a file name inside the cache directory); ValueError otherwise."""
    if not is_slug(slug):
        length = f"{len(slug)} characters, " if isinstance(slug, str) and len(slug) > MAX_SLUG_LENGTH else ""
        raise ValueError(f"not a device name autogemm writes: {str(slug)[:80]!r} ({length}expected lowercase "
                         f"words joined by hyphens, at most {MAX_SLUG_LENGTH} characters, like "
                         "nvidia-h100-80gb-hbm3-sm90)")
    return slug


def _empty_document(device_slug: str) -> dict[str, Any]:
    return {"format": FORMAT, "device": device_slug, "entries": {}}


def valid_records(document: dict[str, Any], where: str, keys: Any = None) -> dict[str, Record]:
    """The records of a document (of `keys` only, where given) that pass validation, by key; one
    warning for the rest."""
    good, bad = {}, []
    entries = document["entries"]
    for key, entry in (entries.items() if keys is None else ((k, entries[k]) for k in keys if k in entries)):
        try:
            record = filed_record(key, entry)
        except ValueError as exc:
            bad.append(f"{shown_value(key)} ({exc})")
            continue
        good[key] = record
    if bad:
        warnings.warn(f"autogemm cache {where}: skipped {len(bad)} bad record(s): " + "; ".join(bad[:3])
                      + ("; ..." if len(bad) > 3 else ""), CacheWarning, stacklevel=3)
    return good


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Writes atomically (atomic_write.py), mode 0644; on any failure (a full disk, say) the old file
    stays and no temporary file is left."""
    write_atomically(Path(path), json.dumps(document, indent=1, sort_keys=True).encode())


def _keeps(previous: Record | None, record: Record) -> bool:
    """Whether a current record with a better ratio to cuBLAS (the figure that is comparable between
    runs) stays instead of `record`. Ratios of an older timing protocol are not comparable
    (host-bound baselines inflated them). Staleness, which renders the kernel, is asked last."""
    return previous is not None and not previous.provisional and previous.protocol >= record.protocol \
        and previous.ratio > record.ratio and not previous.stale


class TuningCache:
    """Tuned results of the user (read-write) and of the shipped cache (read-only)."""

    def __init__(self, directory: Path | str | None = None, shipped: Path | str | None | bool = True):
        self.directory = Path(directory) if directory is not None else user_cache_dir() / "tuned"
        if shipped is True:
            shipped = shipped_cache_dir()
        self.shipped = Path(shipped) if shipped else None

    # ---- files ---------------------------------------------------------------------------------
    def path(self, device_slug: str) -> Path:
        return self.directory / f"{check_slug(device_slug)}.json"

    def _lock(self, device_slug: str) -> FileLock:
        """The lock of a device's document (writers only); OSError where the cache is not writable."""
        from filelock import FileLock  # (lazy: its import costs `import autogemm` ~20 ms; only writers lock)

        self.directory.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.path(device_slug)) + ".lock", timeout=60, mode=FILE_MODE)

    def _load(self, path: Path, device_slug: str, repair: bool) -> dict[str, Any]:
        """A document as its file holds it (its records unchecked). One that is not a document is
        reported and, with `repair` and where the directory can be written, moved aside."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return _empty_document(device_slug)
        except (OSError, UnicodeDecodeError) as exc:
            warnings.warn(f"autogemm cache {path} cannot be read ({exc}); ignoring it", CacheWarning, stacklevel=3)
            return _empty_document(device_slug)
        try:
            document = loads(text)
            if not isinstance(document, dict) or not isinstance(document.get("entries"), dict):
                raise ValueError("no 'entries' object")
            if type(document.get("format")) is not int or document["format"] != FORMAT:
                raise ValueError(f"unknown format {shown_value(document.get('format'))}")
            return document
        except (ValueError, RecursionError) as exc:
            problem = f"autogemm cache {path} is corrupt ({str(exc)[:200]})"
            if repair:
                stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
                aside = path.with_name(f"{path.name}.corrupt-{stamp}")
                try:
                    with self._lock(device_slug):
                        if path.read_text() == text:  # nobody rewrote it meanwhile
                            os.replace(path, aside)
                    warnings.warn(f"{problem}; moved it to {aside} and started afresh", CacheWarning, stacklevel=3)
                except OSError as move_error:
                    warnings.warn(f"{problem}; ignoring it (cannot move it aside: {move_error})", CacheWarning,
                                  stacklevel=3)
            else:
                warnings.warn(f"{problem}; ignoring it", CacheWarning, stacklevel=3)
            return _empty_document(device_slug)

    def document(self, device_slug: str) -> dict[str, Any]:
        """The user's document for a device, as its file holds it (a corrupt one set aside)."""
        return self._load(self.path(device_slug), device_slug, repair=True)

    def shipped_document(self, device_slug: str) -> dict[str, Any]:
        if self.shipped is None:
            return _empty_document(device_slug)
        return self._load(self.shipped / f"{check_slug(device_slug)}.json", device_slug, repair=False)

    # ---- queries -------------------------------------------------------------------------------
    def _sources(self, device_slug: str, include_shipped: bool = True, keys=None):
        yield "user", valid_records(self.document(device_slug), self.path(device_slug), keys)
        if include_shipped and self.shipped is not None:
            yield "shipped", valid_records(self.shipped_document(device_slug), self.shipped / f"{device_slug}.json", keys)

    def lookup(self, problem: Problem, device_slug: str) -> tuple[Record, str] | None:
        """The current (not stale) record for a problem: the user's first, then the shipped one
        (only that record of each document is read and checked)."""
        for source, records in self._sources(device_slug, keys=(problem.key,)):
            record = records.get(problem.key)
            if record is not None and not record.stale:
                return record, source
        return None

    def records(self, device_slug: str, include_shipped: bool = True) -> list[tuple[str, Record]]:
        """Every valid record of a device, current or stale, as (source, record)."""
        return [(source, r) for source, records in self._sources(device_slug, include_shipped) for r in records.values()]

    def devices(self, include_shipped: bool = True) -> list[str]:
        folders = [self.directory] + ([self.shipped] if include_shipped and self.shipped else [])
        slugs = {p.stem for folder in folders if folder.is_dir() for p in folder.glob("*.json")}
        return sorted(s for s in slugs if is_slug(s))

    # ---- updates (OSError where the cache cannot be written) -----------------------------------
    def store(self, record: Record, device_slug: str, *, keep_better: bool = True) -> Path:
        """Adds a record. With `keep_better`, an existing current record with a better ratio to
        cuBLAS (the figure that is comparable between runs) is kept instead. Other entries of the
        document, even ones this version cannot read, are kept as they are."""
        return self._store_all([record], device_slug, keep_better)

    def _store_all(self, records: list[Record], device_slug: str, keep_better: bool = True) -> Path:
        """Adds records of one device as `store` does, in one write of its document."""
        path = self.path(device_slug)
        with self._lock(device_slug):
            document = self._load(path, device_slug, repair=True)
            previous = valid_records(document, path, keys=[r.problem for r in records]) if keep_better else {}
            taken = [record for record in records if not _keeps(previous.get(record.problem), record)]
            if taken:
                document["entries"].update((record.problem, record.to_json()) for record in taken)
                write_json(path, document)
        return path

    def remove(self, device_slug: str, problem_key: str) -> bool:
        path = self.path(device_slug)
        with self._lock(device_slug):
            document = self._load(path, device_slug, repair=True)
            if document["entries"].pop(problem_key, None) is None:
                return False
            write_json(path, document)
        return True

    def clear(self) -> list[Path]:
        removed = []
        for slug in self.devices(include_shipped=False):
            path = self.path(slug)
            with self._lock(slug):
                path.unlink(missing_ok=True)
            removed.append(path)
        return removed

    def export(self, destination: Path | str) -> int:
        """Writes the valid records of every user document into one bundle; returns their number."""
        devices = {slug: {"format": FORMAT, "device": slug,
                          "entries": {k: r.to_json() for _, records in self._sources(slug, False) for k, r in records.items()}}
                   for slug in self.devices(include_shipped=False)}
        write_json(Path(destination), {"format": FORMAT, "devices": devices})
        return sum(len(d["entries"]) for d in devices.values())

    def import_bundle(self, source: Path | str) -> int:
        """Merges a bundle written by `export` (or one device document) as `store` would, record by
        record; returns the records read. The whole bundle is checked first, device names and every
        record: if anything is wrong, ValueError names it and nothing is written. Then each device's
        document is written once, atomically; where the directory refuses a write, CacheWriteError
        says which devices were written before."""
        staged: dict[str, list[Record]] = {}
        for slug, record in read_records(source):
            staged.setdefault(slug, []).append(record)
        written: list[str] = []
        for slug in sorted(staged):
            try:
                self._store_all(staged[slug], slug)
            except OSError as exc:
                done = "nothing imported" if not written else \
                    f"wrote the records of {', '.join(written)}; {', '.join(s for s in sorted(staged) if s not in written)} not written"
                raise CacheWriteError(f"{done}: cannot write the cache directory {self.directory}: {exc}") from exc
            written.append(slug)
        return sum(len(records) for records in staged.values())


def read_records(source: Path | str) -> list[tuple[str, Record]]:
    """(device slug, record) for every record of a device document or an export bundle; ValueError
    naming the file and the first fault (device name, document, record)."""
    try:
        text = Path(source).read_text()
    except FileNotFoundError:
        raise ValueError(f"no such file: {source}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {source}: {str(exc)[:200]}") from None
    try:
        data = loads(text)
    except ValueError as exc:
        raise ValueError(f"{source} is not a JSON document autogemm reads: {str(exc)[:200]}; nothing imported") from None
    if isinstance(data, dict) and isinstance(data.get("devices"), dict):
        documents = data["devices"]
    elif isinstance(data, dict) and isinstance(data.get("entries"), dict) and "device" in data:
        documents = {data["device"]: data}
    else:
        raise ValueError(f"{source} is not an autogemm cache export (nor a device document)")
    if data.get("format", FORMAT) != FORMAT:
        raise ValueError(f"{source}: unknown format {shown_value(data.get('format'))}; nothing imported")
    records = []
    for slug, document in documents.items():
        try:
            check_slug(slug)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}; nothing imported") from None
        if not isinstance(document, dict) or not isinstance(document.get("entries"), dict):
            raise ValueError(f"{source}: the document of {slug} has no 'entries' object; nothing imported")
        for key, entry in document["entries"].items():
            try:
                records.append((slug, filed_record(key, entry)))
            except ValueError as exc:
                raise ValueError(f"{source}: bad record {shown_value(key)} of {slug}: {exc}; nothing imported") from None
    return records
