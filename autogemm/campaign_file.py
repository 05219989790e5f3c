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

    [[problems]]                  # or explicit shapes
    shapes = [[127, 4096, 4096], [8192, 64, 8192]]

Everything is checked before anything runs; a fault names the table, the key and the value. A
problem listed twice is tuned once.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .problem import LAYOUTS, Problem

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
STORAGE_SCHEMES = ("sqlite:///", "postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://",
                   "mysql+pymysql://", "journal:///")
CAMPAIGN_KEYS = {"name", "storage", "devices", "timeout", "trials", "seed", "grace", "patience", "cache_dir"}
PROBLEM_KEYS = {"M", "N", "K", "shapes", "dtype", "compute", "layout", "batch"}
MAX_PROBLEMS = 100_000


class CampaignFileError(ValueError):
    """A campaign file that cannot be used, with what is wrong and where."""


@dataclass(frozen=True)
class Campaign:
    name: str
    problems: tuple[Problem, ...]
    storage: str | None = None  # None: the default SQLite file of the cache directory
    devices: str | tuple = "all"  # "all", or GPU indices (ints) or UUIDs (strings)
    timeout: float = 20.0
    trials: int = 400
    seed: int = 0
    grace: float = 120.0
    patience: int = 100
    cache_dir: str | None = None  # None: the user's cache
    source: str = field(default="", compare=False)


def _positive_number(value, where: str, integer: bool = False):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0 or value != value:
        raise CampaignFileError(f"{where} must be a positive {'integer' if integer else 'number'}, got {value!r}")
    return value


def _values(table: dict, key: str, where: str, default) -> list:
    value = table.get(key, default)
    values = value if isinstance(value, list) else [value]
    if not values:
        raise CampaignFileError(f"{where}.{key} is an empty list")
    return values


def _sizes(table: dict, key: str, where: str, default) -> list[int]:
    sizes = _values(table, key, where, default)
    for size in sizes:
        _positive_number(size, f"{where}.{key}", integer=True)
    return sizes


def _strings(table: dict, key: str, where: str, default: str, allowed: tuple | None = None) -> list[str]:
    values = _values(table, key, where, default)
    for value in values:
        if not isinstance(value, str) or (allowed is not None and value not in allowed):
            choice = f" (one of {', '.join(allowed)})" if allowed else ""
            raise CampaignFileError(f"{where}.{key} must be a string{choice}, got {value!r}")
    return values


def _problems_of(table, where: str) -> list[Problem]:
    if not isinstance(table, dict):
        raise CampaignFileError(f"{where} must be a table, got {table!r}")
    unknown = sorted(set(table) - PROBLEM_KEYS)
    if unknown:
        raise CampaignFileError(f"{where} has unknown keys {', '.join(unknown)} (known: {', '.join(sorted(PROBLEM_KEYS))})")
    if "shapes" in table:
        if any(key in table for key in "MNK"):
            raise CampaignFileError(f"{where} gives both shapes and M/N/K; use one or the other")
        shapes = table["shapes"]
        if not isinstance(shapes, list) or not shapes or not all(isinstance(s, list) and len(s) == 3 for s in shapes):
            raise CampaignFileError(f"{where}.shapes must be a list of [M, N, K] triples, got {shapes!r}")
        for shape in shapes:
            for size in shape:
                _positive_number(size, f"{where}.shapes", integer=True)
        triples = [tuple(s) for s in shapes]
    else:
        if "M" not in table:
            raise CampaignFileError(f"{where} needs M (with N and K, which default to M) or shapes")
        ms = _sizes(table, "M", where, None)
        ns, ks = _sizes(table, "N", where, None) if "N" in table else None, _sizes(table, "K", where, None) if "K" in table else None
        triples = [(m, n, k) for m in ms for n in (ns or [m]) for k in (ks or [m])]
    dtypes = _strings(table, "dtype", where, "float32")
    computes = _strings(table, "compute", where, "")
    layouts = [layout.lower() for layout in _strings(table, "layout", where, "nn")]
    for layout in layouts:
        if layout not in LAYOUTS:
            raise CampaignFileError(f"{where}.layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    batches = _sizes(table, "batch", where, 1)
    count = len(triples) * len(dtypes) * len(computes) * len(layouts) * len(batches)
    if count > MAX_PROBLEMS:
        raise CampaignFileError(f"{where} makes {count} problems (at most {MAX_PROBLEMS})")
    problems = []
    for (m, n, k), dtype, compute, layout, batch in itertools.product(triples, dtypes, computes, layouts, batches):
        try:
            problems.append(Problem.from_layout(m, n, k, layout, batch=batch, dtype=dtype, compute=compute))
        except (TypeError, ValueError) as exc:
            raise CampaignFileError(f"{where}: {exc}") from None
    return problems


def parse_campaign(data: dict, source: str = "") -> Campaign:
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
                                f"(starting with a letter or digit), got {name!r}")
    storage = head.get("storage")
    if storage is not None and (not isinstance(storage, str) or not storage.startswith(STORAGE_SCHEMES)):
        raise CampaignFileError(f"campaign.storage must be a URL starting with one of {', '.join(STORAGE_SCHEMES)}, "
                                f"got {storage!r}")
    devices = head.get("devices", "all")
    if devices != "all":
        if not isinstance(devices, list) or not devices or not all(
                (type(d) is int and d >= 0) or (isinstance(d, str) and re.fullmatch(r"GPU-[0-9a-fA-F-]{8,64}", d))
                for d in devices):
            raise CampaignFileError(f"campaign.devices must be \"all\" or a list of GPU indices or UUIDs "
                                    f"(like \"GPU-8c1e1ad4-...\"), got {devices!r}")
        if len(set(devices)) != len(devices):
            raise CampaignFileError(f"campaign.devices names a GPU twice: {devices!r}")
        devices = tuple(devices)
    cache_dir = head.get("cache_dir")
    if cache_dir is not None and (not isinstance(cache_dir, str) or not cache_dir or "\0" in cache_dir):
        raise CampaignFileError(f"campaign.cache_dir must be a directory path, got {cache_dir!r}")
    patience = head.get("patience", 100)
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
        raise CampaignFileError(f"campaign.patience must be an integer >= 0, got {patience!r}")
    seed = head.get("seed", 0)
    if type(seed) is not int:
        raise CampaignFileError(f"campaign.seed must be an integer, got {seed!r}")
    tables = data.get("problems")
    if not isinstance(tables, list) or not tables:
        raise CampaignFileError("a campaign file needs at least one [[problems]] table")
    problems = list(dict.fromkeys(p for i, table in enumerate(tables) for p in _problems_of(table, f"problems[{i}]")))
    if len(problems) > MAX_PROBLEMS:
        raise CampaignFileError(f"the campaign has {len(problems)} problems (at most {MAX_PROBLEMS})")
    return Campaign(
        name=name, problems=tuple(problems), storage=storage, devices=devices,
        timeout=float(_positive_number(head.get("timeout", 20.0), "campaign.timeout")),
        trials=_positive_number(head.get("trials", 400), "campaign.trials", integer=True),
        seed=seed,
        grace=float(_positive_number(head.get("grace", 120.0), "campaign.grace")),
        patience=patience, cache_dir=cache_dir, source=source,
    )


def load_campaign(path: str | Path) -> Campaign:
    """Reads and checks a campaign file; CampaignFileError (a ValueError) saying what is wrong."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CampaignFileError(f"no such campaign file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CampaignFileError(f"cannot read campaign file {path}: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CampaignFileError(f"{path} is not valid TOML: {exc}") from None
    try:
        campaign = parse_campaign(data, str(path))
    except CampaignFileError as exc:
        raise CampaignFileError(f"{path}: {exc}") from None
    if campaign.cache_dir and not Path(campaign.cache_dir).expanduser().is_absolute():
        # a relative cache directory is the campaign file's neighbour, wherever the command runs
        campaign = dataclasses.replace(campaign, cache_dir=str((path.parent / campaign.cache_dir).resolve()))
    return campaign
