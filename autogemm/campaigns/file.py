"""Campaign files: many problems to tune, with the budget, the storage and the GPUs, in TOML.

    [campaign]
    name = "llm-projections"      # letters, digits, '.', '_', '-': names the claims in the storage
    storage = "postgresql+psycopg2://tuner@db.example/autogemm"   # or sqlite:///..., journal:///...
    devices = "all"               # or GPU indices [0, 1], or UUIDs ["GPU-8c1e...", ...]
    timeout = 20                  # seconds of search per problem (the final re-timing comes on top)
    trials = 400                  # measured candidates per problem, at most
    seed = 0
    grace = 120                   # seconds without a heartbeat after which a claim is taken over

    [[problems]]                  # a grid: every combination of the values given as lists
    M = [1, 16, 64]
    N = [4096, 11008]             # N and K default to M, as on the command line
    K = 4096
    dtype = ["float16", "bfloat16"]
    layout = "nn"                 # also: compute, batch (scalars or lists)
    epilogue = ["", "bias_n+gelu"]  # epilogue keys, as problem keys end ("": none; bias, activation, res)

    [[problems]]                  # or explicit shapes
    shapes = [[127, 4096, 4096], [8192, 64, 8192]]

    [[problems]]                  # grouped products (mixture-of-experts layers): M rows in all over the groups
    M = [4096, 65536]
    N = 768
    K = 2048
    groups = 128                  # instead of batch
    routing = ["uniform", "skewed"]   # autogemm.routing's buckets (default uniform)
    dtype = "bfloat16"
    layout = "nt"

Everything is checked before anything runs; a fault names the table, the key and the value. A
problem listed twice is tuned once. The size of a campaign is counted from its lists before any
problem is made (a few lines of TOML can ask for billions), across every table.

A file's `cache_dir` is where its results go, and a file storage's path (`sqlite:///`, `journal:///`)
where its studies and claims go: each a path relative to the file's folder, which must stay inside
that folder (symbolic links followed), so that a campaign file from someone else cannot write
anywhere else. An absolute path outside the folder is taken only where the user says so
(`load_campaign(..., trust_cache_dir=True)`, `autogemm campaign ... --trust-paths`); or the user
names the directory on the command line (`--cache-dir`), which replaces the file's.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..epilogue import Epilogue, require_measurable
from ..problem import LAYOUTS, Problem
from ..measure.grouped_measuring import require_groupable
from ..routing import ROUTINGS
from ..results.url_secrets import shown_url
from ..tuning.options import TuneOptions

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
STORAGE_SCHEMES = ("sqlite:///", "postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://",
                   "mysql+pymysql://", "journal:///")
CAMPAIGN_KEYS = {"name", "storage", "devices", "timeout", "trials", "seed", "grace", "patience", "cache_dir"}
PROBLEM_KEYS = {"M", "N", "K", "shapes", "dtype", "compute", "layout", "batch", "epilogue", "groups", "routing"}
# Bounds that keep a campaign file from stopping the parser or every worker, each read in well under
# a second: problems in all (at 10 s each, 10,000 are days of one GPU; the shipped campaign has
# 103); the file's size (256 KiB: 10,000 explicit shapes; Python's TOML parser reads dense arrays
# at about 300 KB/s); seconds (a grace under a second would spin the heartbeat thread, an infinite
# one kills it; a week is the longest any wait needs); counts.
MAX_PROBLEMS = 10_000
MAX_FILE_BYTES = 256 << 10
MIN_GRACE_S = 1.0
MAX_SECONDS = 7 * 24 * 3600.0
MAX_TRIALS = 1_000_000
MAX_DEVICES = 1024
MAX_URL_CHARS = 4096
SEEDS = 2 ** 32  # numpy's generators take seeds below 2**32
# Each problem's tune: `autogemm tune`'s options, but 20 s of search where the file gives no timeout
DEFAULT_TUNE = TuneOptions(timeout=20.0)


class CampaignFileError(ValueError):
    """A campaign file that cannot be used, with what is wrong and where."""


@dataclass(frozen=True)
class Campaign:
    name: str
    problems: tuple[Problem, ...]
    storage: str | None = None  # None: the default SQLite file of the cache directory
    devices: str | tuple[Any, ...] = "all"  # "all", or GPU indices (ints) or UUIDs (strings)
    tune_options: TuneOptions = DEFAULT_TUNE  # the file's timeout, trials, seed and patience; the rest default
    grace: float = 120.0
    cache_dir: str | None = None  # None: the user's cache
    source: str = field(default="", compare=False)


def _positive_number(value, where: str, integer: bool = False):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0 or value != value:
        raise CampaignFileError(f"{where} must be a positive {'integer' if integer else 'number'}, got {_shown(value)}")
    return value


def _seconds(value, where: str, least: float) -> float:
    """A finite number of seconds, at least `least` (above 0 where that is 0) and at most MAX_SECONDS."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not (least <= value <= MAX_SECONDS and value > 0):
        bound = f"at least {least:g}" if least > 0 else "above 0"
        raise CampaignFileError(f"{where} must be a number of seconds, {bound} and at most {MAX_SECONDS:g}, "
                                f"got {_shown(value)}")
    return float(value)


def _count(value, where: str, least: int, most: int) -> int:
    if type(value) is not int or not least <= value <= most:
        raise CampaignFileError(f"{where} must be an integer from {least} to {most}, got {_shown(value)}")
    return value


def _storage(storage) -> str | None:
    """The storage URL as given, or None; refused where no worker could share it."""
    if storage is None:
        return None
    if not isinstance(storage, str) or not storage.startswith(STORAGE_SCHEMES):
        # (a refused URL is shown without its password: the message reaches terminals and logs)
        shown = repr(shown_url(storage)) if isinstance(storage, str) else _shown(storage)
        raise CampaignFileError(f"campaign.storage must be a URL starting with one of {', '.join(STORAGE_SCHEMES)}, "
                                f"got {shown}")
    if len(storage) > MAX_URL_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in storage):
        raise CampaignFileError(f"campaign.storage must be a URL of at most {MAX_URL_CHARS} printable characters")
    path = storage.split("///", 1)[1] if storage.startswith(("sqlite:///", "journal:///")) else None
    if path is not None and (not path or ":memory:" in path or "mode=memory" in path):
        # each worker process would have a database of its own: nothing shared, nothing kept
        raise CampaignFileError(f"campaign.storage must name a file for {storage.split(':', 1)[0]}, "
                                f"got {shown_url(storage)!r} (an in-memory database is not shared between workers)")
    return storage


def _values(table: dict[str, Any], key: str, where: str, default) -> list[Any]:
    value = table.get(key, default)
    values = value if isinstance(value, list) else [value]
    if not values:
        raise CampaignFileError(f"{where}.{key} is an empty list")
    return values


def _sizes(table: dict[str, Any], key: str, where: str, default) -> list[int]:
    sizes = _values(table, key, where, default)
    for size in sizes:
        _positive_number(size, f"{where}.{key}", integer=True)
    return sizes


def _strings(table: dict[str, Any], key: str, where: str, default: str, allowed: tuple[Any, ...] | None = None) -> list[str]:
    values = _values(table, key, where, default)
    for value in values:
        if not isinstance(value, str) or (allowed is not None and value not in allowed):
            choice = f" (one of {', '.join(allowed)})" if allowed else ""
            raise CampaignFileError(f"{where}.{key} must be a string{choice}, got {_shown(value)}")
    return values


def _shown(value) -> str:
    """A value as a message quotes it: a long list is cut (the message must stay a line)."""
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(value) if isinstance(value, list) else len(text)} long)"


def _problem_count(table: dict[str, Any], where: str) -> int:
    """How many problems a table makes, from the lengths of its lists alone (nothing is built)."""
    def length(key: str) -> int:
        value = table.get(key, 1)
        if isinstance(value, list) and not value:
            raise CampaignFileError(f"{where}.{key} is an empty list")
        return len(value) if isinstance(value, list) else 1

    if "shapes" in table:
        shapes = table["shapes"]
        if not isinstance(shapes, list) or not shapes:
            raise CampaignFileError(f"{where}.shapes must be a list of [M, N, K] triples, got {_shown(shapes)}")
        count = len(shapes)
    else:
        count = length("M") * length("N") * length("K")
    for key in ("dtype", "compute", "layout", "batch", "epilogue", "groups", "routing"):
        count *= length(key)
    return count


def _problems_of(table, where: str, room: int) -> list[Problem]:
    """The problems of one [[problems]] table; `room`: how many more the campaign may have."""
    if not isinstance(table, dict):
        raise CampaignFileError(f"{where} must be a table, got {_shown(table)}")
    unknown = sorted(set(table) - PROBLEM_KEYS)
    if unknown:
        raise CampaignFileError(f"{where} has unknown keys {', '.join(unknown)} (known: {', '.join(sorted(PROBLEM_KEYS))})")
    if "shapes" in table and any(key in table for key in "MNK"):
        raise CampaignFileError(f"{where} gives both shapes and M/N/K; use one or the other")
    if "shapes" not in table and "M" not in table:
        raise CampaignFileError(f"{where} needs M (with N and K, which default to M) or shapes")
    count = _problem_count(table, where)
    if count > MAX_PROBLEMS:
        raise CampaignFileError(f"{where} makes {count} problems (at most {MAX_PROBLEMS})")
    if count > room:
        raise CampaignFileError(f"the campaign makes {MAX_PROBLEMS - room + count} problems or more with {where} "
                                f"(at most {MAX_PROBLEMS} in all)")
    if "shapes" in table:
        shapes = table["shapes"]
        if not all(isinstance(s, list) and len(s) == 3 for s in shapes):
            raise CampaignFileError(f"{where}.shapes must be a list of [M, N, K] triples, got {_shown(shapes)}")
        for shape in shapes:
            for size in shape:
                _positive_number(size, f"{where}.shapes", integer=True)
        triples = [tuple(s) for s in shapes]
    else:
        ms = _sizes(table, "M", where, None)
        ns, ks = _sizes(table, "N", where, None) if "N" in table else None, _sizes(table, "K", where, None) if "K" in table else None
        triples = [(m, n, k) for m in ms for n in (ns or [m]) for k in (ks or [m])]
    dtypes = _strings(table, "dtype", where, "float32")
    computes = _strings(table, "compute", where, "")
    layouts = [layout.lower() for layout in _strings(table, "layout", where, "nn")]
    for layout in layouts:
        if layout not in LAYOUTS:
            raise CampaignFileError(f"{where}.layout must be one of {', '.join(LAYOUTS)}, got {_shown(layout)}")
    if "groups" in table and "batch" in table:
        raise CampaignFileError(f"{where} gives both groups (grouped products) and batch (strided batches); use one")
    if "routing" in table and "groups" not in table:
        raise CampaignFileError(f"{where}.routing is for grouped products: give groups too")
    if "groups" in table:  # (count, grouped, routing bucket) of each kind of product the table makes
        routings = _strings(table, "routing", where, ROUTINGS[0], ROUTINGS)
        kinds = [(groups, True, routing) for groups in _sizes(table, "groups", where, None) for routing in routings]
    else:
        kinds = [(batch, False, "") for batch in _sizes(table, "batch", where, 1)]
    epilogues = []
    for key in _strings(table, "epilogue", where, ""):
        try:
            epilogue = Epilogue.from_key(key) if key else Epilogue()
        except (TypeError, ValueError) as exc:
            raise CampaignFileError(f"{where}.epilogue {_shown(key)}: {exc}") from None
        epilogues.append(epilogue)
    problems = []
    for (m, n, k), dtype, compute, layout, (batch, grouped, routing), epilogue in itertools.product(
            triples, dtypes, computes, layouts, kinds, epilogues):
        try:
            problem = Problem.from_layout(m, n, k, layout, batch=batch, dtype=dtype, compute=compute, epilogue=epilogue,
                                          grouped=grouped, routing=routing)
            require_measurable(problem, "not tuned")
            if grouped:
                require_groupable(problem)
        except (TypeError, ValueError) as exc:
            raise CampaignFileError(f"{where}: {exc}") from None
        problems.append(problem)
    return problems


def parse_campaign(data: dict[str, Any], source: str = "") -> Campaign:
    """A campaign from the TOML document's data; CampaignFileError naming the first fault."""
    if not isinstance(data, dict) or not isinstance(data.get("campaign"), dict):
        raise CampaignFileError("a campaign file needs a [campaign] table (with at least name)")
    unknown = sorted(set(data) - {"campaign", "problems"})
    if unknown:
        raise CampaignFileError(f"unknown top-level keys {', '.join(unknown)} (expected [campaign] and [[problems]])")
    head = data["campaign"]
    unknown = sorted(set(head) - CAMPAIGN_KEYS)
    if unknown:
        raise CampaignFileError(f"[campaign] has unknown keys {', '.join(unknown)} (known: {', '.join(sorted(CAMPAIGN_KEYS))})")
    name = head.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise CampaignFileError(f"campaign.name must be 1-64 letters, digits, '.', '_' or '-' "
                                f"(starting with a letter or digit), got {_shown(name)}")
    storage = _storage(head.get("storage"))
    devices = head.get("devices", "all")
    if devices != "all":
        if isinstance(devices, list) and len(devices) > MAX_DEVICES:
            raise CampaignFileError(f"campaign.devices names {len(devices)} GPUs (at most {MAX_DEVICES})")
        if not isinstance(devices, list) or not devices or not all(
                (type(d) is int and d >= 0) or (isinstance(d, str) and re.fullmatch(r"GPU-[0-9a-fA-F-]{8,64}", d))
                for d in devices):
            raise CampaignFileError(f"campaign.devices must be \"all\" or a list of GPU indices or UUIDs "
                                    f"(like \"GPU-8c1e1ad4-...\"), got {_shown(devices)}")
        if len(set(devices)) != len(devices):
            raise CampaignFileError(f"campaign.devices names a GPU twice: {_shown(devices)}")
        devices = tuple(devices)
    cache_dir = head.get("cache_dir")
    if cache_dir is not None and (not isinstance(cache_dir, str) or not cache_dir or len(cache_dir) > 4096
                                  or any(ord(c) < 32 for c in cache_dir)):
        raise CampaignFileError(f"campaign.cache_dir must be a directory path, got {_shown(cache_dir)}")
    patience = _count(head.get("patience", DEFAULT_TUNE.patience), "campaign.patience", 0, MAX_TRIALS)
    seed = _count(head.get("seed", DEFAULT_TUNE.seed), "campaign.seed", 0, SEEDS - 1)
    timeout = _seconds(head.get("timeout", DEFAULT_TUNE.timeout), "campaign.timeout", 0.0)
    trials = _count(head.get("trials", DEFAULT_TUNE.trials), "campaign.trials", 1, MAX_TRIALS)
    grace = _seconds(head.get("grace", 120.0), "campaign.grace", MIN_GRACE_S)
    tables = data.get("problems")
    if not isinstance(tables, list) or not tables:
        raise CampaignFileError("a campaign file needs at least one [[problems]] table")
    made: list[Problem] = []  # every table's, a problem listed twice counted twice (an upper bound)
    for i, table in enumerate(tables):
        made += _problems_of(table, f"problems[{i}]", MAX_PROBLEMS - len(made))
    tune_options = dataclasses.replace(DEFAULT_TUNE, timeout=timeout, trials=trials, seed=seed, patience=patience)
    return Campaign(name=name, problems=tuple(dict.fromkeys(made)), storage=storage, devices=devices,
                    tune_options=tune_options, grace=grace, cache_dir=cache_dir, source=source)


def load_campaign(path: str | Path, *, trust_cache_dir: bool = False, cache_dir: str | Path | None = None) -> Campaign:
    """Reads and checks a campaign file; CampaignFileError (a ValueError) saying what is wrong.
    Its cache_dir must lie inside the file's folder, or be an absolute path with `trust_cache_dir`
    (see the module's text); `cache_dir` (the user's, from the command line) replaces the file's."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise CampaignFileError(f"no such campaign file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CampaignFileError(f"cannot read campaign file {path}: {exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise CampaignFileError(f"{path} is more than {MAX_FILE_BYTES} bytes (at most {MAX_FILE_BYTES})")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CampaignFileError(f"{path} is not valid TOML: {exc}") from None
    except RecursionError:  # (tomllib reads nested arrays recursively)
        raise CampaignFileError(f"{path} is not valid TOML here: its arrays or tables are nested too deeply") from None
    try:
        campaign = parse_campaign(data, str(path))
        if campaign.storage:  # (also where --cache-dir is given: that replaces the cache_dir only)
            campaign = dataclasses.replace(campaign, storage=_storage_in(path, campaign.storage, trust_cache_dir))
        if cache_dir is not None:
            return dataclasses.replace(campaign, cache_dir=str(Path(cache_dir).expanduser().resolve()))
        if campaign.cache_dir:
            campaign = dataclasses.replace(campaign, cache_dir=str(_path_in(path, campaign.cache_dir, trust_cache_dir,
                                                                                "cache_dir")))
    except CampaignFileError as exc:
        raise CampaignFileError(f"{path}: {exc}") from None
    return campaign


def _path_in(path: Path, given: str, trusted: bool, key: str) -> Path:
    """A path the campaign file names (its cache_dir, or its storage's file) as an absolute path, a
    relative one being the file's neighbour wherever the command runs, if it lies inside the file's
    folder (symbolic links followed), or is absolute and trusted (--trust-paths)."""
    folder = path.parent.resolve()
    wanted = Path(given).expanduser()
    try:
        resolved = (folder / wanted).resolve()  # (an absolute `wanted` replaces the folder)
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, say
        raise CampaignFileError(f"campaign.{key} {given!r} cannot be resolved ({exc})") from None
    if resolved == folder or folder in resolved.parents:
        return resolved
    other = " or give the directory with --cache-dir" if key == "cache_dir" else ""
    if not wanted.is_absolute():
        raise CampaignFileError(f"campaign.{key} {given!r} leads out of the campaign file's folder {folder} "
                                f"(to {resolved}); give a path inside it{',' + other if other else ''}")
    if not trusted:
        raise CampaignFileError(f"campaign.{key} {given!r} is outside the campaign file's folder {folder}: "
                                "a campaign file decides where anything is written only if you say so "
                                f"(--trust-paths){other and ','}{other}")
    return resolved


FILE_STORAGES = ("sqlite:///", "journal:///")  # storages that are a file (and its .lock, .claims.db beside it)


def _storage_in(path: Path, storage: str, trusted: bool) -> str:
    """A file storage the campaign file names, its file placed as a cache_dir is (`_path_in`): its
    workers create that file, its lock and claims files and its folders, and append to it. A
    database server's URL is taken as it is."""
    scheme = next((s for s in FILE_STORAGES if storage.startswith(s)), None)
    if scheme is None:
        return storage
    given, mark, query = storage[len(scheme):].partition("?") if scheme == "sqlite:///" else (storage[len(scheme):], "", "")
    return f"{scheme}{_path_in(path, given, trusted, 'storage')}{mark}{query}"
