"""What was measured across problems, for `autogemm report`: the benchmark results files of a
device (shape suites, the copy bandwidth some of them measured), the compute ceilings (the best
TFLOP/s measured per dtype and compute mode, never a datasheet's peak), the bandwidth ceiling and
the ratio to cuBLAS per shape. Files are matched to a device by the name they record; rows that do
not name a problem, or hold no positive figure, are left out.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import dtypes
from ..problem import Problem

# Where a source checkout keeps the benchmark scripts' results (a wheel has none).
RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
# The shape-suite run shown when several were found: what users get first, then the others.
SWEEP_MODES = ("shipped", "tuned", "loo", "empty")


@dataclass
class Ceiling:
    value: float  # TFLOP/s for compute, GB/s for bandwidth
    source: str


@dataclass
class SweepPoint:
    shape: str
    group: str  # dtype/compute
    ratio: float


def moved_bytes(problem: Problem) -> int:
    itemsize = dtypes.lookup(problem.dtype, problem.compute).itemsize
    return itemsize * problem.batch * (problem.m * problem.k + problem.k * problem.n + problem.m * problem.n)


def intensity(problem: Problem) -> float:
    """Flops per byte moved, each operand read once and C written once."""
    return problem.flops / moved_bytes(problem)


def group_of(problem: Problem) -> str:
    return f"{problem.dtype}/{problem.compute}"


def shape_of(problem: Problem) -> str:
    batch = f"{problem.batch}×" if problem.batch > 1 else ""
    return f"{batch}{problem.m}×{problem.n}×{problem.k} {problem.layout.upper()}"


def name_matches(device_name: str, slug: str) -> bool:
    """Whether a device name (as a results file holds it) is the device of `slug` (Device.slug:
    the name in hyphenated lowercase words, then the architecture)."""
    base = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return bool(base) and re.fullmatch(re.escape(base) + r"-sm\d+a?", slug) is not None


def read_results(path: Path) -> dict[str, Any]:
    """A benchmark results document (JSON with a device name); ValueError saying why not."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"benchmark results {path} cannot be read ({str(exc)[:200]})") from None
    if not isinstance(document, dict) or not isinstance(document.get("device"), str):
        raise ValueError(f"benchmark results {path} name no device (expected a JSON object with \"device\")")
    return document


def _positive(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value > 0


def result_rows(document: dict[str, Any]) -> list[tuple[Problem, dict[str, Any]]]:
    """The rows of a results document that name a problem, the rest (malformed rows) left out."""
    rows = []
    for row in document.get("rows", []) if isinstance(document.get("rows"), list) else []:
        if isinstance(row, dict) and isinstance(row.get("problem"), str):
            try:
                rows.append((Problem.from_key(row["problem"]), row))
            except (ValueError, KeyError, TypeError):
                pass
    return rows


def found_results(slug: str) -> list[tuple[Path, dict[str, Any]]]:
    """The benchmark results this checkout holds for a device: its files by name, each checked to
    record that device (one that cannot be read is passed over, as any other file would be)."""
    found = []
    for path in sorted(RESULTS_DIR.glob(f"*-{slug}*.json")) if RESULTS_DIR.is_dir() else []:
        try:
            document = read_results(path)
        except ValueError:
            continue
        if name_matches(document["device"], slug):
            found.append((path, document))
    return found


def measured_ceilings(records: list[Any], documents: list[tuple[Path, dict[str, Any]]]) -> dict[str, Ceiling]:
    """The best TFLOP/s measured per dtype/compute, ours or cuBLAS's, in the cache records and the
    benchmark results of a device: a measured figure, not a datasheet's peak."""
    best: dict[str, Ceiling] = {}

    def offer(problem: Problem, tflops, what: str) -> None:
        if _positive(tflops) and tflops > best.get(group_of(problem), Ceiling(0.0, "")).value:
            best[group_of(problem)] = Ceiling(float(tflops), f"best measured: {what} on {shape_of(problem)}")

    for source, record in records:
        problem = record.problem_object
        offer(problem, record.cublas_tflops, f"cuBLAS ({source} cache record)")
        if not record.is_cublas:
            offer(problem, record.tflops, f"{record.config_name} ({source} cache record)")
    for path, document in documents:
        for problem, row in result_rows(document):
            offer(problem, row.get("tflops"), f"autogemm.matmul ({path.name})")
            for key, who in (("cupy_ms", "cupy.matmul"), ("cublas_ms", "cuBLAS"), ("time_ms", "best kernel")):
                if _positive(row.get(key)):
                    offer(problem, problem.flops / row[key] / 1e9, f"{who} ({path.name})")
    return best


def measured_bandwidth(given_gbs: float | None, documents: list[tuple[Path, dict[str, Any]]]) -> Ceiling | None:
    if given_gbs is not None:
        return Ceiling(given_gbs, "given with --bandwidth")
    measured = [(doc["bandwidth"] / 1e9, path) for path, doc in documents if _positive(doc.get("bandwidth"))]
    if not measured:
        return None
    value, path = max(measured)
    return Ceiling(value, f"measured: a 1 GiB device-to-device copy, read and written ({path.name})")


def shape_sweep(records: list[Any], documents: list[tuple[Path, dict[str, Any]]]) -> tuple[list[SweepPoint], str]:
    """The ratio to cuBLAS per shape and dtype: from a shape-suite results file (the preferred run
    where several were found), else from the device's cache records."""
    suites = [(path, doc) for path, doc in documents if doc.get("mode") is not None and result_rows(doc)]
    if suites:
        def rank(item):
            mode = item[1].get("mode")
            return SWEEP_MODES.index(mode) if mode in SWEEP_MODES else len(SWEEP_MODES)

        path, document = min(suites, key=rank)
        points = [SweepPoint(shape_of(p), group_of(p), float(row["ratio"])) for p, row in result_rows(document)
                  if _positive(row.get("ratio"))]
        return points, (f"{path.name}: autogemm.matmul against cupy.matmul, run '{document.get('mode')}'"
                        + (f" ({document['note']})" if isinstance(document.get("note"), str) else ""))
    points = [SweepPoint(shape_of(r.problem_object), group_of(r.problem_object),
                         (r.best_generated.get("ratio") or r.ratio) if r.is_cublas else r.ratio)
              for _, r in records if not r.stale]
    return points, ("the cache's current records: the tuned kernel's ratio to cuBLAS measured in its tune "
                    "(for records that kept cuBLAS, the best generated kernel's)")
