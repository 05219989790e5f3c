"""The store of tuned results: one JSON document per device, entries keyed by the problem.

Documents live in ``<cache dir>/tuned/<device-slug>.json`` (the user's, written by tuning) and in
the tuned results shipped with autogemm (read after the user's). Writes are atomic (temporary file
+ rename) under a file lock, so concurrent tuners lose nothing. A corrupt document is reported,
moved aside and rebuilt; a record whose template hash differs from the current templates is
ignored by lookups and shown as stale by listings. The hash is that of the record's own kernel
template and what it includes, so that editing one family's templates leaves the others' records
current.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from filelock import FileLock

from .families import config_from_dict
from .paths import shipped_cache_dir, user_cache_dir
from .problem import Problem
from .render import kernel_template_hash

FORMAT = 1


class CacheWarning(UserWarning):
    pass


@dataclass
class Record:
    """One tuned result: the winning config and what was measured in the same run."""

    problem: str  # Problem.key
    family: str
    config: dict
    config_name: str
    time_ms: float
    tflops: float
    cublas_ms: float
    cublas_tflops: float
    ratio: float  # cuBLAS time / kernel time, measured in the same run
    rel_error: float
    template_hash: str  # render.kernel_template_hash of the config's template when it was tuned
    device: str  # device name as the driver reports it
    versions: dict = field(default_factory=dict)
    date: str = ""
    trials: dict = field(default_factory=dict)  # valid / rejected / failed counts of the tuning run
    wall_s: float = 0.0
    study: str = ""
    provisional: bool = False  # best so far of a tune still running (or killed); replaced by its end

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Record:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def config_object(self):
        return config_from_dict({"family": self.family, **self.config})

    @property
    def problem_object(self) -> Problem:
        return Problem.from_key(self.problem)

    @property
    def stale(self) -> bool:
        try:
            return self.template_hash != kernel_template_hash(self.config_object.template)
        except (TypeError, ValueError):  # a config no family reads any more is never current
            return True


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def runtime_versions() -> dict:
    """autogemm, CuPy, CUDA runtime, driver and NVRTC versions (a change can break a kernel)."""
    from .version import __version__

    versions = {"autogemm": __version__}
    try:
        import cupy

        versions["cupy"] = cupy.__version__
        runtime = cupy.cuda.runtime.runtimeGetVersion()
        driver = cupy.cuda.runtime.driverGetVersion()
        versions["cuda_runtime"] = f"{runtime // 1000}.{runtime % 1000 // 10}"
        versions["driver_api"] = f"{driver // 1000}.{driver % 1000 // 10}"
        major, minor = cupy.cuda.nvrtc.getVersion()
        versions["nvrtc"] = f"{major}.{minor}"
    except Exception:  # no GPU runtime here: record what is known
        pass
    return versions


def _empty_document(device_slug: str) -> dict:
    return {"format": FORMAT, "device": device_slug, "entries": {}}


class TuningCache:
    """Tuned results of the user (read-write) and of the shipped cache (read-only)."""

    def __init__(self, directory: Path | str | None = None, shipped: Path | str | None | bool = True):
        self.directory = Path(directory) if directory is not None else user_cache_dir() / "tuned"
        if shipped is True:
            shipped = shipped_cache_dir()
        self.shipped = Path(shipped) if shipped else None

    # ---- files ---------------------------------------------------------------------------------
    def path(self, device_slug: str) -> Path:
        return self.directory / f"{device_slug}.json"

    def _lock(self, device_slug: str) -> FileLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.path(device_slug)) + ".lock", timeout=60)

    def _read(self, path: Path, device_slug: str, repair: bool) -> dict:
        """Reads a document; a corrupt one is reported and (with `repair`) moved aside."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return _empty_document(device_slug)
        try:
            document = json.loads(text)
            if not isinstance(document, dict) or not isinstance(document.get("entries"), dict):
                raise ValueError("no 'entries' object")
            if document.get("format") != FORMAT:
                raise ValueError(f"unknown format {document.get('format')!r}")
            for key, entry in document["entries"].items():
                Record.from_json(entry)
                Problem.from_key(key)
            return document
        except (ValueError, TypeError, KeyError) as exc:
            if repair:
                stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
                aside = path.with_name(f"{path.name}.corrupt-{stamp}")
                os.replace(path, aside)
                warnings.warn(f"autogemm cache {path} is corrupt ({exc}); moved it to {aside} and started afresh",
                              CacheWarning, stacklevel=3)
            else:
                warnings.warn(f"autogemm cache {path} is corrupt ({exc}); ignoring it", CacheWarning, stacklevel=3)
            return _empty_document(device_slug)

    def _write(self, path: Path, document: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(document, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)  # atomic: readers see the old or the new document, never half
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def document(self, device_slug: str) -> dict:
        """The user's document for a device (corruption repaired under the lock)."""
        path = self.path(device_slug)
        if not path.exists():
            return _empty_document(device_slug)
        with self._lock(device_slug):
            return self._read(path, device_slug, repair=True)

    def shipped_document(self, device_slug: str) -> dict:
        if self.shipped is None:
            return _empty_document(device_slug)
        return self._read(self.shipped / f"{device_slug}.json", device_slug, repair=False)

    # ---- queries -------------------------------------------------------------------------------
    def lookup(self, problem: Problem, device_slug: str) -> tuple[Record, str] | None:
        """The current (not stale) record for a problem: the user's first, then the shipped one."""
        for source, document in (("user", self.document(device_slug)), ("shipped", self.shipped_document(device_slug))):
            entry = document["entries"].get(problem.key)
            if entry:
                record = Record.from_json(entry)
                if not record.stale:
                    return record, source
        return None

    def records(self, device_slug: str, include_shipped: bool = True) -> list[tuple[str, Record]]:
        """Every record of a device, current or stale, as (source, record)."""
        out = [("user", Record.from_json(e)) for e in self.document(device_slug)["entries"].values()]
        if include_shipped:
            out += [("shipped", Record.from_json(e)) for e in self.shipped_document(device_slug)["entries"].values()]
        return out

    def devices(self, include_shipped: bool = True) -> list[str]:
        folders = [self.directory] + ([self.shipped] if include_shipped and self.shipped else [])
        slugs = {p.stem for folder in folders if folder.is_dir() for p in folder.glob("*.json")}
        return sorted(slugs)

    # ---- updates -------------------------------------------------------------------------------
    def store(self, record: Record, device_slug: str, *, keep_better: bool = True) -> Path:
        """Adds a record. With `keep_better`, an existing current record with a better ratio to
        cuBLAS (the figure that is comparable between runs) is kept instead."""
        path = self.path(device_slug)
        with self._lock(device_slug):
            document = self._read(path, device_slug, repair=True)
            old = document["entries"].get(record.problem)
            if keep_better and old:
                previous = Record.from_json(old)
                if not previous.stale and not previous.provisional and previous.ratio > record.ratio:
                    return path
            document["entries"][record.problem] = record.to_json()
            self._write(path, document)
        return path

    def remove(self, device_slug: str, problem_key: str) -> bool:
        path = self.path(device_slug)
        with self._lock(device_slug):
            document = self._read(path, device_slug, repair=True)
            if document["entries"].pop(problem_key, None) is None:
                return False
            self._write(path, document)
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
        """Writes every user document into one bundle; returns the number of records."""
        bundle = {"format": FORMAT, "devices": {slug: self.document(slug) for slug in self.devices(include_shipped=False)}}
        self._write(Path(destination), bundle)
        return sum(len(d["entries"]) for d in bundle["devices"].values())

    def import_bundle(self, source: Path | str) -> int:
        """Merges a bundle written by `export` (or one device document); returns records taken."""
        try:
            data = json.loads(Path(source).read_text())
        except FileNotFoundError:
            raise ValueError(f"no such file: {source}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source} is not JSON: {exc}") from None
        if isinstance(data, dict) and "devices" in data:
            documents = data["devices"]
        elif isinstance(data, dict) and "entries" in data and "device" in data:
            documents = {data["device"]: data}
        else:
            raise ValueError(f"{source} is not an autogemm cache export")
        taken = 0
        for slug, document in documents.items():
            for entry in document.get("entries", {}).values():
                try:
                    record = Record.from_json(entry)
                    Problem.from_key(record.problem)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"{source}: bad record for {slug}: {exc}") from None
                self.store(record, slug)
                taken += 1
        return taken
