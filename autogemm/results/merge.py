"""Cache files from many runs, hosts and campaigns made into one: `autogemm cache merge A B ... -o OUT`.

Inputs are device documents (`<device>.json`, as the cache and the shipped `cache/` hold them) or
bundles written by `autogemm cache export`. Every record is checked as the cache checks it; one bad
record stops the merge with its file and key named, and nothing is written. Per (device, problem)
the best record is kept: a current record before a stale one (measured with templates that have
changed since), a finished one before a provisional one, then the higher ratio to cuBLAS (the
figure measured in the same run, so comparable between hosts). With `replace`, a later file's record
replaces an earlier one's instead (a re-tune on new code replaces the old records rather than competing
with them on the noise of two draws). Each record keeps its provenance: host, date, versions (autogemm,
CUDA driver and runtime, NVRTC).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .cache import FORMAT, Record, read_records, write_json


def _rank(record: Record) -> tuple[Any, ...]:
    return (not record.stale, not record.provisional, record.ratio)


def merge_records(sources: list[Path | str], replace: bool = False) -> dict[str, dict[str, Record]]:
    """The best record per device and problem over every source (read and checked first); with `replace`,
    the last source's record of each."""
    best: dict[str, dict[str, Record]] = {}
    for source in sources:
        for slug, record in read_records(source):
            kept = best.setdefault(slug, {}).get(record.problem)
            if kept is None or replace or _rank(record) > _rank(kept):
                best[slug][record.problem] = record
    return best


def merge_files(sources: list[Path | str], output: Path | str, replace: bool = False) -> dict[str, int]:
    """Writes the merge of `sources` to `output` (atomically): a device document where every record
    is of one device (ready to serve as `<device>.json`), else an export bundle. Returns records
    per device. `replace`: a later source's record replaces an earlier one's (merge_records)."""
    if not sources:
        raise ValueError("nothing to merge: name at least one cache file")
    best = merge_records(sources, replace)
    write_documents({slug: {key: record.to_json() for key, record in records.items()} for slug, records in best.items()},
                    output)
    return {slug: len(records) for slug, records in best.items()}


def write_documents(entries: dict[str, dict[str, Any]], output: Path | str) -> None:
    """Writes {device slug: {problem key: record JSON}} to `output` (atomically): a device document
    where there is one device (ready to serve as `<device>.json`), else an export bundle."""
    documents = {slug: {"format": FORMAT, "device": slug, "entries": dict(sorted(found.items()))}
                 for slug, found in sorted(entries.items())}
    if len(documents) == 1:
        write_json(Path(output), next(iter(documents.values())))
    else:
        write_json(Path(output), {"format": FORMAT, "devices": documents})
