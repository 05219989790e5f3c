"""How the commands print a table: left-aligned columns as wide as their widest cell."""

from __future__ import annotations


def table(header: tuple, rows: list[tuple]) -> str:
    widths = [max(len(str(line[i])) for line in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(line, widths)).rstrip() for line in [header, *rows])
