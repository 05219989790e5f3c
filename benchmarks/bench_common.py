"""What the benchmarks share: operands of a problem as a user holds them, labels, geomeans, where
results go."""

from __future__ import annotations

import math
from pathlib import Path

HERE = Path(__file__).resolve().parent


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def percentile(values, fraction: float) -> float:
    """The `fraction` quantile (linear interpolation), e.g. 0.05 for the 5th percentile."""
    values = sorted(values)
    if not values:
        return float("nan")
    position = fraction * (len(values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def repository_files(folder: str, pattern: str) -> list[Path]:
    """The files of the repository's `folder` (cache, campaigns) that `pattern` matches, sorted. SystemExit where
    there are none: the draws leave out what they hold, so without them a seed would draw other problems, and a
    run from a partial copy of the repository would measure a draw that `--list` does not give."""
    files = sorted((HERE.parent / folder).glob(pattern))
    if not files:
        raise SystemExit(f"no {folder}/{pattern} in {HERE.parent}: the draws leave out the problems they hold and "
                         "would draw others without them; run the benchmark from a whole checkout")
    return files


def rows_outside_draw(rows, drawn) -> list[dict]:
    """The rows of a results file that are not the draw's problem at their index (`drawn`: its spec tuples)."""
    return [r for r in rows if not (isinstance(r.get("index"), int) and 0 <= r["index"] < len(drawn)
                                    and tuple(r.get("spec", ())) == tuple(drawn[r["index"]]))]


def require_rows_of_draw(path: Path, drawn) -> None:
    """SystemExit naming the rows of `path` that are not its draw's (rows_outside_draw): a file filled by a run
    of another draw must be neither reported nor added to as this one."""
    strays = rows_outside_draw(read_rows(path), drawn) if path.exists() else []
    if strays:
        named = ", ".join(f"#{r.get('index')} {r.get('label', r.get('problem', '?'))}" for r in strays[:5])
        raise SystemExit(f"{path} holds {len(strays)} rows that are not this draw's problem at their index ({named}"
                         f"{', ...' if len(strays) > 5 else ''}): they were measured for another draw; move them "
                         "out of the file or choose another --out")


def results_path(stem: str) -> Path:
    """benchmarks/results/<stem> (the caller adds .md or .json)."""
    out = HERE / "results" / stem
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def problem_label(problem) -> str:
    batch = f"{problem.batch}x" if problem.batch > 1 else ""
    compute = "tf32" if problem.compute == "tf32" else problem.dtype
    return f"{compute} {problem.layout} {batch}{problem.m}x{problem.n}x{problem.k}"


def make_operands(spec, seed: int = 0):
    """(problem, a, b) for spec (dtype, compute, layout, batch, M, N, K): CuPy arrays of values in
    [-1, 1] as a user holds them (a transposed operand is a transposed view of a row-major array;
    bfloat16 as ml_dtypes' type)."""
    import cupy

    from autogemm.measure.bench import random_uniform
    from autogemm.problem import Problem

    dtype, compute, layout, batch, m, n, k = spec
    problem = Problem.from_layout(m, n, k, layout, batch=batch, dtype=dtype, compute=compute)
    lead = (batch,) if batch > 1 else ()
    a = random_uniform(lead + ((k, m) if problem.trans_a else (m, k)), dtype, seed=seed)
    b = random_uniform(lead + ((n, k) if problem.trans_b else (k, n)), dtype, seed=seed + 1)
    if dtype == "bfloat16":
        import ml_dtypes

        a, b = a.view(ml_dtypes.bfloat16), b.view(ml_dtypes.bfloat16)
    if problem.trans_a:
        a = cupy.swapaxes(a, -1, -2)
    if problem.trans_b:
        b = cupy.swapaxes(b, -1, -2)
    return problem, a, b


def case_epilogue(case: str):
    """The Epilogue of an epilogue benchmark's case name: "residual", "bias", or "bias+<activation>" (the bias
    along N, as F.linear adds it)."""
    from autogemm.epilogue import Epilogue

    return Epilogue(residual=True) if case == "residual" else Epilogue(bias="n", activation=case.partition("+")[2])


# ---- results files of a row a problem (bench_tuned_half, bench_unseen_epilogues) --------------------------
def read_rows(path: Path) -> list[dict]:
    """The rows of a JSON lines results file; a last line cut short (a run killed while writing) is left out."""
    import json

    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def device_of(slug: str | None) -> tuple[str, str]:
    """(slug, name) of the device a results file is for: the one given (--device-slug), named as the shipped
    results document of that slug names its GPU (the slug itself where none does), else the current GPU's."""
    if slug:
        return slug, _shipped_device_name(slug) or slug
    from autogemm.gpu.launch import current_device

    device = current_device()
    return device.slug, device.name


def _shipped_device_name(slug: str) -> str | None:
    """The GPU's name in the shipped results document of `slug` (its first entry's), if there is one."""
    from autogemm.results.cache import TuningCache, is_slug

    if not is_slug(slug):  # (no file name made of anything else)
        return None
    entries = TuningCache().shipped_document(slug)["entries"]  # (empty where none is shipped)
    name = next(iter(entries.values()), {}).get("device")
    return name if isinstance(name, str) else None


def write_report(path: Path, report) -> int:
    """The Markdown table `report(rows)` (its lines) of the results file `path`, written beside it (same
    stem) and printed; SystemExit where the file has no rows."""
    rows = read_rows(path)
    if not rows:
        raise SystemExit(f"no rows in {path}")
    text = "\n".join(report(rows)) + "\n"
    path.with_suffix(".md").write_text(text)
    print(text)
    return 0


def deadline_after(seconds: float) -> float:
    """The time.time() `seconds` from now (0: no deadline), as run_rows takes it."""
    import time

    return time.time() + seconds if seconds else 0.0


def run_rows(path: Path | None, items, key, measure, deadline: float, said, out=None) -> list[dict]:
    """Measures each (index, spec) of `items` whose `key(spec)` has no row in `path` yet (a JSON lines file;
    None: nothing kept), appending its row (`measure(spec, index)`, its "problem" the key) at once and
    printing `said(row)` to `out` (stdout); starts none after `deadline` (a time.time(), deadline_after; 0: no
    limit), so that a run cut short or spread over several commands loses nothing. The rows measured here."""
    import json
    import sys
    import time

    out = out or sys.stdout
    done = {row["problem"] for row in read_rows(path)} if path is not None else set()
    rows = []
    for index, spec in items:
        if key(spec) in done:
            continue
        if deadline and time.time() > deadline:
            print(f"deadline: stopping before #{index}", file=out, flush=True)
            break
        row = measure(spec, index)
        row.setdefault("problem", key(spec))
        rows.append(row)
        if path is not None:
            with path.open("a") as file:
                file.write(json.dumps(row) + "\n")
        print(said(row), file=out, flush=True)
    return rows


def results_arguments(parser, seed: int, count: int, per_problem: str) -> None:
    """The options of a benchmark that writes a row a problem (run_rows): the draw's --seed and --count,
    --out, --deadline-s (`per_problem`: what a problem takes, for its help), --list, --report and
    --device-slug."""
    parser.add_argument("--seed", type=int, default=seed,
                        help=f"seed of the problem generator (default {seed}: the published table; develop with another)")
    parser.add_argument("--count", type=int, default=count, help=f"problems drawn (default {count})")
    parser.add_argument("--out", help="the JSON lines file rows are appended to (default under benchmarks/results/)")
    parser.add_argument("--deadline-s", type=float, default=0.0,
                        help=f"start no problem after this many seconds (0: no limit; {per_problem}): a run fits a "
                             "time slot, the rest left for the next run")
    parser.add_argument("--list", action="store_true", help="print the problems and exit (no GPU needed)")
    parser.add_argument("--report", action="store_true", help="write the Markdown table from the results file and exit")
    parser.add_argument("--device-slug", help="with --report: the device's slug (default: the current GPU's)")


def mixed_codes(rows) -> list[str]:
    """A report's warning where its rows were measured with different codes (their `source_digest`s): no lines
    where they were all measured with one."""
    digests = sorted({r.get("source_digest", "none") for r in rows})
    return ([f"**The rows were measured with {len(digests)} different codes** (source digests {', '.join(digests)}): "
             "they do not make one table.", ""] if len(digests) > 1 else [])


def partial_draw(rows, drawn: int | None, what: str = "problems") -> list[str]:
    """A report's warning where fewer of the draw's `drawn` problems have run than it holds: no lines where all
    have (or `drawn` is not known)."""
    return ([f"**{len(rows)} of the {drawn} {what} drawn have run; the other {drawn - len(rows)} have not yet.**", ""]
            if drawn and len(rows) < drawn else [])


def keep_compiled_kernels(prefix: str) -> None:
    """One cubin directory for the whole run (AUTOGEMM_CUBIN_DIR, unless already set): each problem is tuned
    in a results cache of its own, but finds the kernels the problems before it compiled, as a user's next
    tune does. (Only a first tune on a fresh install compiles every candidate it measures.)"""
    import os
    import tempfile

    os.environ.setdefault("AUTOGEMM_CUBIN_DIR", tempfile.mkdtemp(prefix=prefix))


def rounds_noise(ours: list[float], theirs: list[float]) -> float | None:
    """The noise of `theirs` over `ours`, round by round, as a tune's keep rule measures a comparison's
    (timing.Sustained.noise: twice the standard error of the rounds' paired ratios over their mean, at least
    MIN_NOISE), a fraction of the ratio; None where the rounds are not paired (unequal counts, fewer than two)."""
    if len(ours) != len(theirs) or len(ours) < 2:
        return None
    from autogemm.measure.timing import Sustained

    return Sustained(kernel_rounds=[ours], baseline_rounds={"theirs": theirs}).noise(0)


def kernels_kept(rows) -> str:
    """What a report says of its rows' compiled kernels (their `kernels_kept`, keep_compiled_kernels)."""
    kept = {bool(r.get("kernels_kept")) for r in rows}
    if kept == {True}:
        return " (compiled kernels kept for the run)"
    return " (each problem's kernels compiled afresh)" if kept == {False} else \
        " (compiled kernels kept for the run in some rows, compiled afresh in others)"


def source_digest(root: Path | None = None) -> str:
    """16 hex digits of autogemm's sources (Python, and the C++ of linear's memo), kernel templates and search
    spaces (of the checkout at `root`, this one by default): rows measured with one code share it."""
    import hashlib

    digest = hashlib.sha256()
    root = root or Path(__file__).resolve().parent.parent
    package = root / "autogemm"
    for path in sorted([*package.rglob("*.py"), *package.rglob("*.cpp"), *package.rglob("*.h"),
                        *(root / "templates").glob("*.j2"), *(root / "search_spaces").glob("*.toml")]):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def build_linear_memo() -> tuple[bool, str]:
    """Builds linear's C++ memo (autogemm/serving/native_linear.py) before anything is timed, waiting for it: every
    process but a machine's first (per PyTorch) finds it built, and a layer timed while it builds in the background
    meets the Python route instead (H200, 2026-12-05, a fresh machine: bench_epilogues' seven layers under 1.0x eager
    one call at a time, 0.905-0.943x, were all among its first eleven; every later layer of M <= 128, 41 of them,
    ran 1.024-1.253x). Whether it is loaded, and how a report says so."""
    from autogemm.serving import native_linear

    if native_linear.build(wait=True):
        return True, "built before the timing"
    return False, f"{native_linear.status()} (the Python route serves)"


def release_memory() -> None:
    """Gives back what the last problem's operands and results held (sizes vary a lot): CuPy's pool, and
    PyTorch's cache where PyTorch is loaded."""
    import sys

    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    if "torch" in sys.modules:
        sys.modules["torch"].cuda.empty_cache()
