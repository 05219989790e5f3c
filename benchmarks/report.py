"""Results files of the benchmarks: one Markdown document per device under benchmarks/results/,
in which each benchmark script owns one section and rewrites only that section."""

from __future__ import annotations

import datetime
import os
import re
import tempfile
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def results_path(device_slug: str) -> Path:
    return RESULTS_DIR / f"{device_slug}.md"


def update_section(device_slug: str, device_name: str, section: str, body: str) -> Path:
    """Replaces (or appends) the section `section` of the device's results file, atomically."""
    path = results_path(device_slug)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else f"# Benchmark results: {device_name}\n"
    begin, end = f"<!-- begin {section} -->", f"<!-- end {section} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as out:
        out.write(text if text.endswith("\n") else text + "\n")
    os.replace(tmp, path)
    return path


def update_table(device_slug: str, device_name: str, section: str, head: list[str], new_rows: dict[str, str]) -> Path:
    """Rewrites `section` as `head` (text and table header) followed by the section's table rows
    merged with `new_rows` (see merge_rows)."""
    rows = merge_rows(device_slug, section, new_rows)
    return update_section(device_slug, device_name, section, "\n".join([*head, *rows]))


def merge_rows(device_slug: str, section: str, new_rows: dict[str, str]) -> list[str]:
    """Table rows of `section` (lines starting with '| key |'), with `new_rows` replacing or adding
    rows by their first cell: rerunning a benchmark for one problem keeps the other problems' rows."""
    path = results_path(device_slug)
    rows: dict[str, str] = {}
    if path.exists():
        match = re.search(re.escape(f"<!-- begin {section} -->") + r"(.*?)" + re.escape(f"<!-- end {section} -->"),
                          path.read_text(), re.S)
        if match:
            lines = match.group(1).splitlines()
            for i, line in enumerate(lines):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                # a header is the row above a separator row (| --- | ...)
                is_header = i + 1 < len(lines) and lines[i + 1].startswith("| -")
                if line.startswith("| ") and cells and cells[0] and not set(cells[0]) <= set("-: ") \
                        and not is_header:
                    rows[cells[0]] = line
    rows.update(new_rows)
    return list(rows.values())


def today() -> str:
    return datetime.date.today().isoformat()


def versions() -> str:
    import cupy

    from autogemm import __version__

    cuda = cupy.cuda.runtime.runtimeGetVersion()
    driver = cupy.cuda.runtime.driverGetVersion()
    return (f"autogemm {__version__}, CuPy {cupy.__version__}, CUDA runtime {cuda // 1000}.{cuda % 1000 // 10}, "
            f"driver API {driver // 1000}.{driver % 1000 // 10}")
