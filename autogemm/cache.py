"""The store of tuned results: one JSON document per device, entries keyed by the problem.

Documents live in ``<cache dir>/tuned/<device-slug>.json`` (the user's, written by tuning) and in
the tuned results shipped with autogemm (read after the user's). Writes are atomic (temporary file
+ rename, fsynced, mode 0644 so that a team can share the directory) under a file lock, so
concurrent tuners lose nothing; reads take no lock, so a read-only cache (a shared mount) serves
read-only. Nothing read from a file is trusted: a document that is not one is moved aside (or
ignored where it cannot be moved), and every record is validated (types, ranges, a config some
family reads) before use; a bad one is skipped with a warning naming the file and the key. Device
names become file names only in the form `Device.slug` gives them. A record whose template hash
differs from its kernel template's today is ignored by lookups and shown as stale by listings.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
import os
import re
import tempfile
import warnings
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from filelock import FileLock

from .families import config_from_dict
from .paths import shipped_cache_dir, user_cache_dir
from .problem import Problem
from .render import kernel_digest, kernel_template_hash

FORMAT = 1
# the form Device.slug gives a device's name: lowercase letters and digits in hyphenated words
DEVICE_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
CUBLAS = "cublas"  # the family of records whose winner is cuBLAS itself
FILE_MODE = 0o644


class CacheWarning(UserWarning):
    pass


def check_slug(slug) -> str:
    """`slug` if it is a device slug (so a file name inside the cache directory); ValueError otherwise."""
    if not isinstance(slug, str) or not DEVICE_SLUG.fullmatch(slug):
        raise ValueError(f"not a device name autogemm writes: {str(slug)[:80]!r} "
                         "(expected lowercase words joined by hyphens, like nvidia-h100-80gb-hbm3-sm90)")
    return slug


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
    # For a cuBLAS record (family "cublas": no generated kernel beat cuBLAS by more than the noise):
    # the best generated kernel it measured, {"family", "config", "config_name", "ratio"}
    best_generated: dict = field(default_factory=dict)
    host: str = ""  # where it was measured (provenance, shown when caches from several hosts merge)
    # render.kernel_digest of the kernel (for a cuBLAS record: of the best generated one) when it was
    # tuned; the record is current while its config still renders to that source. Records written
    # before this field existed fall back to template_hash.
    source_digest: str = ""
    # The timing protocol (timing.PROTOCOL) of the figures: 1, records written before it had a number,
    # whose cuBLAS times could be host-bound. time_ms and cublas_ms are GPU times (cublas_ms: the
    # faster baseline's); latency_us and baseline_latency_us single-call latencies of what the record
    # serves and of the served cuBLAS fallback (0: not measured); baselines: ms of each baseline.
    protocol: int = 1
    latency_us: float = 0.0
    baseline_latency_us: float = 0.0
    baselines: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        data = asdict(self)
        if not self.best_generated:
            del data["best_generated"]
        return data

    @property
    def is_cublas(self) -> bool:
        return self.family == CUBLAS

    @property
    def current_protocol(self) -> bool:
        """Measured under today's timing protocol (GPU time for every competitor, and latencies)."""
        from .timing import PROTOCOL

        return self.protocol >= PROTOCOL

    @property
    def latency_ratio(self) -> float | None:
        """The served cuBLAS fallback's latency over this record's (None: not measured)."""
        return self.baseline_latency_us / self.latency_us if self.latency_us and self.baseline_latency_us else None

    @classmethod
    def from_json(cls, data) -> Record:
        """A record read from a file, every field checked; ValueError naming the first fault."""
        if not isinstance(data, dict):
            raise ValueError(f"a record must be an object, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        missing = [name for name, f in known.items()
                   if f.default is MISSING and f.default_factory is MISSING and name not in data]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        values = {name: data[name] for name in known if name in data}
        for name in ("problem", "family", "config_name", "template_hash", "device", "date", "study", "host",
                     "source_digest"):
            if name in values and not isinstance(values[name], str):
                raise ValueError(f"{name} must be a string, got {_shown(values[name])}")
        for name in ("time_ms", "tflops", "cublas_ms", "cublas_tflops", "ratio"):
            value = values[name]
            if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {_shown(value)}")
        for name, allow_nan in (("rel_error", True), ("wall_s", False)):
            value = values.get(name, 0.0)
            if type(value) not in (int, float) or (math.isnan(value) and not allow_nan) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {_shown(value)}")
        for name in ("config", "versions", "trials"):
            if name in values and not isinstance(values[name], dict):
                raise ValueError(f"{name} must be an object, got {_shown(values[name])}")
        # the run's facts are flat: a nested value would be carried into every export and listing
        for key, value in values.get("versions", {}).items():
            if not isinstance(value, str):
                raise ValueError(f"versions.{key} must be a string, got {_shown(value)}")
        for key, value in values.get("trials", {}).items():
            if type(value) is not int or value < 0:
                raise ValueError(f"trials.{key} must be a count (an int >= 0), got {_shown(value)}")
        if type(values.get("protocol", 1)) is not int or values.get("protocol", 1) < 1:
            raise ValueError(f"protocol must be an int >= 1, got {_shown(values.get('protocol'))}")
        for name in ("latency_us", "baseline_latency_us"):
            value = values.get(name, 0.0)
            if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {_shown(value)}")
        if not isinstance(values.get("baselines", {}), dict) or any(
                not isinstance(key, str) or type(value) not in (int, float) or not math.isfinite(value) or value <= 0
                for key, value in values.get("baselines", {}).items()):
            raise ValueError(f"baselines must map names to positive numbers, got {_shown(values.get('baselines'))}")
        if type(values.get("provisional", False)) is not bool:
            raise ValueError(f"provisional must be true or false, got {_shown(values['provisional'])}")
        if "best_generated" in values and not isinstance(values["best_generated"], dict):
            raise ValueError(f"best_generated must be an object, got {_shown(values['best_generated'])}")
        Problem.from_key(values["problem"])
        record = cls(**values)
        if record.is_cublas:
            if record.config or record.config_name != CUBLAS:
                raise ValueError(f"a cuBLAS record has no config, got {_shown(record.config)} named {_shown(record.config_name)}")
            record.__dict__["config_object"] = None
            if record.best_generated:
                record.__dict__["best_generated_object"] = _best_generated(record.best_generated)
            return record
        if "family" in record.config:  # the record's own field names it; a second one would go unchecked
            raise ValueError(f"config must not name a family (the record's family field does), got {_shown(record.config['family'])}")
        config = config_from_dict({**record.config, "family": record.family})
        if config.name != record.config_name:
            raise ValueError(f"config_name {_shown(record.config_name)} is not its config's name {config.name!r}")
        record.__dict__["config_object"] = config  # parsed once: the cached property's value
        return record

    @functools.cached_property
    def config_object(self):
        """The generated kernel's config; None for a cuBLAS record."""
        return None if self.is_cublas else config_from_dict({**self.config, "family": self.family})

    @functools.cached_property
    def best_generated_object(self):
        return _best_generated(self.best_generated) if self.best_generated else None

    @property
    def problem_object(self) -> Problem:
        return Problem.from_key(self.problem)

    @property
    def stale(self) -> bool:
        """Measured with a kernel whose source has changed since: the generated winner's own, or for
        a cuBLAS record the kernel it beat (new kernels might win now). Only the record's own kernel
        counts: editing another family's template, or a part of a template this kernel does not
        render, leaves it current."""
        try:
            config = self.best_generated_object if self.is_cublas else self.config_object
            if config is None:
                return bool(self.template_hash)
            if self.source_digest:
                return self.source_digest != kernel_digest(config, self.problem_object)
            return self.template_hash != kernel_template_hash(config.template)
        except Exception:  # a config no family reads or no template renders any more is never current
            return True


def cublas_record(generated: Record, latency_ratio: float | None = None) -> Record:
    """The record of a tune that kept cuBLAS: cuBLAS's figures, and the generated kernel it beat
    (whose template's hash makes the record stale once the templates change), with its ratio in GPU
    time and in single-call latency."""
    best = {"family": generated.family, "config": generated.config, "config_name": generated.config_name,
            "ratio": generated.ratio, "tflops": generated.tflops, "rel_error": generated.rel_error}
    if latency_ratio is not None:
        best["latency_ratio"] = latency_ratio
    return dataclasses.replace(
        generated, family=CUBLAS, config={}, config_name=CUBLAS, time_ms=generated.cublas_ms,
        tflops=generated.cublas_tflops, ratio=1.0, rel_error=float("nan"), best_generated=best,
        latency_us=generated.baseline_latency_us,
    )


def _best_generated(data: dict):
    """The config of a cuBLAS record's best generated kernel, checked like a record's."""
    config = config_from_dict({**data.get("config", {}), "family": data.get("family")})
    if data.get("config_name") != config.name:
        raise ValueError(f"best_generated config_name {_shown(data.get('config_name'))} is not its config's name")
    ratio = data.get("ratio")
    if type(ratio) not in (int, float) or not math.isfinite(ratio) or ratio <= 0:
        raise ValueError(f"best_generated ratio must be a positive number, got {_shown(ratio)}")
    return config


def _empty_document(device_slug: str) -> dict:
    return {"format": FORMAT, "device": device_slug, "entries": {}}


def filed_record(key: str, entry) -> Record:
    """The record filed under `key` in a document; ValueError if it is not a valid record of that key."""
    try:
        record = Record.from_json(entry)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    if record.problem != key:
        raise ValueError(f"it is the record of {record.problem}")
    return record


def valid_records(document: dict, where, keys=None) -> dict[str, Record]:
    """The records of a document (of `keys` only, where given) that pass validation, by key; one
    warning for the rest."""
    good, bad = {}, []
    entries = document["entries"]
    for key, entry in (entries.items() if keys is None else ((k, entries[k]) for k in keys if k in entries)):
        try:
            record = filed_record(key, entry)
        except ValueError as exc:
            bad.append(f"{_shown(key)} ({exc})")
            continue
        good[key] = record
    if bad:
        warnings.warn(f"autogemm cache {where}: skipped {len(bad)} bad record(s): " + "; ".join(bad[:3])
                      + ("; ..." if len(bad) > 3 else ""), CacheWarning, stacklevel=3)
    return good


def write_json(path: Path, document: dict) -> None:
    """Writes atomically (temporary file in the same directory, fsync, rename), mode 0644; on any
    failure (a full disk, say) the old file stays and no temporary file is left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(document, out, indent=1, sort_keys=True)
            out.flush()
            os.fchmod(out.fileno(), FILE_MODE)
            os.fsync(out.fileno())
        os.replace(tmp, path)  # atomic: readers see the old or the new document, never half
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        self.directory.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.path(device_slug)) + ".lock", timeout=60, mode=FILE_MODE)

    def _load(self, path: Path, device_slug: str, repair: bool) -> dict:
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
            document = json.loads(text)
            if not isinstance(document, dict) or not isinstance(document.get("entries"), dict):
                raise ValueError("no 'entries' object")
            if type(document.get("format")) is not int or document["format"] != FORMAT:
                raise ValueError(f"unknown format {_shown(document.get('format'))}")
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

    def document(self, device_slug: str) -> dict:
        """The user's document for a device, as its file holds it (a corrupt one set aside)."""
        return self._load(self.path(device_slug), device_slug, repair=True)

    def shipped_document(self, device_slug: str) -> dict:
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
        return sorted(s for s in slugs if DEVICE_SLUG.fullmatch(s))

    # ---- updates (OSError where the cache cannot be written) -----------------------------------
    def store(self, record: Record, device_slug: str, *, keep_better: bool = True) -> Path:
        """Adds a record. With `keep_better`, an existing current record with a better ratio to
        cuBLAS (the figure that is comparable between runs) is kept instead. Other entries of the
        document, even ones this version cannot read, are kept as they are."""
        path = self.path(device_slug)
        with self._lock(device_slug):
            document = self._load(path, device_slug, repair=True)
            previous = valid_records(document, path, keys=(record.problem,)).get(record.problem)
            # (ratios of an older timing protocol are not comparable: host-bound baselines inflated them)
            if keep_better and previous is not None and not previous.stale and not previous.provisional \
                    and previous.protocol >= record.protocol and previous.ratio > record.ratio:
                return path
            document["entries"][record.problem] = record.to_json()
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
        """Merges a bundle written by `export` (or one device document); returns records taken.
        The whole bundle is checked first, device names and every record: if anything is wrong,
        ValueError names it and nothing is written."""
        from .cache_merge import read_records

        staged = read_records(source)
        for slug, record in staged:
            self.store(record, slug)
        return len(staged)
