"""`autogemm cache`: list, show, verify, retime, export, import and clear tuned results."""

from __future__ import annotations

import argparse
import json
import sys

from .arguments import EXIT_FAILURES, CliError, CliFailure
from .tables import table
from .tuning import require_gpu


def cmd_cache(args: argparse.Namespace) -> int:
    from ..cache import TuningCache

    if args.action == "merge":
        return _cache_merge(args.key, args.output)
    if len(args.key) > 1:
        raise CliError(f"cache {args.action} takes one argument, got {len(args.key)}")
    args.key = args.key[0] if args.key else None
    cache = TuningCache()
    if args.action == "list":
        rows, records = [], []
        for slug in cache.devices():
            for source, record in cache.records(slug):
                status = "stale (its kernel changed)" if record.stale else "ok"
                rows.append((slug, source, record.problem, record.config_name, f"{record.tflops:.1f}",
                             f"{record.ratio:.3f}", record.date[:10], status))
                records.append({**record.to_json(), "device_slug": slug, "source": source, "status": status})
        if args.json:
            print(json.dumps(records, indent=2))
            return 0
        if not rows:
            print(f"no tuned kernels in {cache.directory}" + (f" or {cache.shipped}" if cache.shipped else ""))
            return 0
        print(table(("device", "source", "problem", "config", "TFLOP/s", "vs cuBLAS", "date", "status"), rows))
        return 0
    if args.action == "show":
        if not args.key:
            raise CliError("cache show needs a problem key, e.g. float32/fp32/nn/b1/4096x4096x4096")
        matches = [{"device": slug, "source": source, **record.to_json()}
                   for slug in cache.devices() for source, record in cache.records(slug) if record.problem == args.key]
        if not matches:
            raise CliFailure(f"no cached entry for {args.key}")
        print(json.dumps(matches, indent=2))
        return 0
    if args.action == "export":
        if not args.key:
            raise CliError("cache export needs a destination file")
        count = cache.export(args.key)
        print(f"exported {count} records to {args.key}")
        return 0
    if args.action == "import":
        if not args.key:
            raise CliError("cache import needs a file written by cache export")
        try:
            count = cache.import_bundle(args.key)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        print(f"merged {count} records from {args.key} into {cache.directory}")
        return 0
    if args.action == "verify":
        return _cache_verify(cache, include_shipped=args.all)
    if args.action == "retime":
        return _cache_retime(cache, args.key, args.force, args.only)
    if args.action == "clear":
        if not args.yes:
            if not sys.stdin.isatty():
                raise CliError("cache clear deletes every tuned result in " f"{cache.directory}; add --yes to confirm")
            answer = input(f"delete every tuned result in {cache.directory}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 1
        removed = cache.clear()
        print(f"removed {len(removed)} cache files from {cache.directory}")
        return 0
    raise CliError(f"unknown cache action {args.action!r}")


def _cache_merge(sources: list[str], output: str | None) -> int:
    from ..cache_merge import merge_files

    if not sources:
        raise CliError("cache merge needs the cache files to merge (device documents or exports)")
    if not output:
        raise CliError("cache merge needs -o OUT, the file to write")
    try:
        counts = merge_files(sources, output)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliFailure(f"cannot write {output}: {exc}") from None
    print(f"merged {len(sources)} file(s) into {output}: " + ", ".join(f"{n} records of {slug}" for slug, n in counts.items()))
    return 0


def _cache_retime(cache, file, force: bool, only) -> int:
    """Re-times this GPU's records of a device document (the user's, or FILE) under the current timing
    protocol (retime.py)."""
    from pathlib import Path

    from ..launch import current_device
    from ..retime import retime_document
    from ..tuner import default_jobs

    require_gpu()
    device = current_device()
    path = Path(file) if file else cache.path(device.slug)
    if not path.is_file():
        raise CliFailure(f"no document to retime at {path}" + ("" if file else f" (nothing tuned on {device.name} yet)"))
    try:
        done = retime_document(path, device, force=force, jobs=default_jobs(),
                               only=[text for text in only.split(",") if text] if only else None,
                               progress=lambda line: print(line, flush=True))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    kept = sum(1 for item in done if item.after != "cublas")
    print(f"re-timed {len(done)} record(s) of {path} on {device.name}: {kept} serve a generated kernel, "
          f"{len(done) - kept} cuBLAS")
    return 0


def _cache_verify(cache, include_shipped: bool) -> int:
    """Re-verifies every current record of this GPU; drops the user's that fail."""
    from ..evaluate import FatalEvaluationError
    from ..isolate import IsolatedEvaluator
    from ..launch import current_device

    require_gpu()
    device = current_device()
    records = [(source, r) for source, r in cache.records(device.slug, include_shipped=include_shipped) if not r.stale]
    if not records:
        print(f"nothing to verify for {device.name} in {cache.directory}")
        return 0
    bad = 0
    width = max(len(r.problem) for _, r in records)  # the problem column fits every key
    for source, record in records:
        problem = record.problem_object
        if record.is_cublas:  # nothing generated is served for it
            print(f"ok      {record.problem:<{width}} cuBLAS kept (no generated kernel to verify)")
            continue
        try:
            evaluator = IsolatedEvaluator(problem, device, jobs=1)
        except FatalEvaluationError as exc:
            raise CliFailure(str(exc)) from None
        try:
            result = evaluator.verify(record.config_object)
        finally:
            evaluator.close()
        if result.ok:
            print(f"ok      {record.problem:<{width}} {record.config_name}  rel. error {result.rel_error:.1e}, "
                  f"{result.tflops:.1f} TFLOP/s (cached {record.tflops:.1f})")
            continue
        bad += 1
        if source == "user":
            cache.remove(device.slug, record.problem)
            action = "dropped"
        else:
            action = "shipped, kept"
        print(f"FAILED  {record.problem:<{width}} {record.config_name}  {result.kind}: {result.message[:120]} ({action})")
    print(f"{len(records) - bad}/{len(records)} cached kernels verified on {device.name}")
    return EXIT_FAILURES if bad else 0
