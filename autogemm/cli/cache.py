"""`autogemm cache ACTION`: list, show, verify, retime, export, import, merge and clear tuned results,
each action a subcommand with its own help and only its own flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .. import dtypes
from ..gpu import launch
from ..measure.evaluate import FatalEvaluationError
from ..measure.isolate import FIRST_REQUEST_SLACK_S, IsolatedEvaluator, candidate_timeout
from ..measure.retime import retime_document
from ..problem import LAYOUTS, Problem
from ..results.cache import TuningCache
from ..results.merge import merge_files
from ..tuning.options import default_jobs
from .arguments import EXIT_FAILURES, CliError, CliFailure, add_output_argument, positive_int
from .tables import table
from .tuning import require_gpu
from .output import print_json


def add_cache_parser(sub: Any) -> None:
    cache_p = sub.add_parser("cache", help="list, show, export, import, merge or clear tuned results",
                             description="Manage tuned results. User results live in $AUTOGEMM_CACHE_DIR or the "
                             "user cache directory; results shipped with autogemm are listed too and read after "
                             "the user's. `autogemm cache ACTION --help` tells more of each action.")
    actions = cache_p.add_subparsers(dest="action", metavar="ACTION")
    cache_p.set_defaults(handler=lambda args: cache_p.print_help() or 0)  # no action: its help (an action's handler replaces it)

    list_p = actions.add_parser("list", help="every tuned result (stale ones marked)",
                                description="List every tuned result, the user's and the shipped ones; a record "
                                "whose kernel's source changed since it was tuned is marked stale.")
    list_p.add_argument("--json", action="store_true", help="every record as JSON, with its device slug, source and status")
    _add_filters(list_p)
    list_p.set_defaults(handler=_cache_list)

    show_p = actions.add_parser("show", help="the records of a problem key, or of the problems the filters pick, as JSON",
                                description="Print every record (of every device, user's and shipped) of a problem "
                                "key, or of every problem the filters pick.")
    show_p.add_argument("key", nargs="?", metavar="KEY", help="problem key, e.g. float32/fp32/nn/b1/4096x4096x4096")
    _add_filters(show_p)
    show_p.set_defaults(handler=_cache_show)

    verify_p = actions.add_parser("verify", help="re-verify this GPU's cached kernels and drop the wrong ones",
                                  description="Re-verify this GPU's cached kernels on fresh inputs, each in an "
                                  "isolated process, and drop the user's that are wrong. Exits 1 if any is.")
    verify_p.add_argument("--all", action="store_true", help="also the shipped results for this GPU (reported, not dropped)")
    verify_p.set_defaults(handler=lambda args: _cache_verify(_cache(), include_shipped=args.all))

    retime_p = actions.add_parser("retime", help="measure this GPU's records again under the current timing protocol",
                                  description="Measure this GPU's records again under the current timing protocol: "
                                  "GPU time in steady state and single-call latency against the faster baseline; a "
                                  "kernel that no longer wins in both becomes a cuBLAS record. Records already at the "
                                  "protocol, whose kernels this NVRTC release compiled when they were measured, are "
                                  "skipped unless --force.")
    retime_p.add_argument("file", nargs="?", metavar="FILE",
                          help="a device document such as cache/<device>.json (default: the user's for this GPU)")
    retime_p.add_argument("--force", action="store_true", help="also records already at the current protocol")
    retime_p.add_argument("--only", help="only problem keys containing one of these comma-separated texts")
    retime_p.set_defaults(handler=lambda args: _cache_retime(_cache(), args.file, args.force, args.only))

    export_p = actions.add_parser("export", help="write every user record into one bundle",
                                  description="Write the valid records of every user document into one bundle "
                                  "(for cache import on another machine).")
    add_output_argument(export_p, "the bundle to write")
    export_p.set_defaults(handler=_cache_export)

    import_p = actions.add_parser("import", help="merge a bundle (or a device document) into the user's results",
                                  description="Merge a bundle written by cache export (or one device document) "
                                  "into the user's results; a current record with a better ratio to cuBLAS is kept. "
                                  "The whole file is checked first: if anything in it is wrong, nothing is written. "
                                  "Each device's document is then written once, atomically.")
    import_p.add_argument("file", metavar="FILE", help="a file written by cache export, or a device document")
    import_p.set_defaults(handler=_cache_import)

    merge_p = actions.add_parser("merge", help="the best record per device and problem of several cache files",
                                 description="Merge several cache documents or exports into one file: the best "
                                 "record per device and problem (with --replace: the last FILE's), with each "
                                 "record's host, date and versions.")
    merge_p.add_argument("files", nargs="*", metavar="FILE", help="device documents or exports to merge")
    merge_p.add_argument("--replace", action="store_true",
                         help="a later FILE's record of a problem replaces an earlier one's, whatever their figures "
                              "(a re-tune on new code replaces the old records instead of competing with them on "
                              "the noise of two draws): cache merge OLD.json RETUNED.json --replace -o OLD.json")
    add_output_argument(merge_p, "the file to write (a device document if every record is of one device, else an "
                                 "export bundle)")
    merge_p.set_defaults(handler=lambda args: _cache_merge(args.files, args.output, args.replace))

    clear_p = actions.add_parser("clear", help="delete every user tuned result",
                                 description="Delete every tuned result of the user (the shipped ones stay).")
    clear_p.add_argument("--yes", action="store_true", help="clear without asking")
    clear_p.set_defaults(handler=_cache_clear)


def _cache():
    return TuningCache()


def _add_filters(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("filters", "only the records of problems with these sizes, dtype and layout")
    group.add_argument("--m", "--M", dest="m", metavar="M", type=positive_int, help="rows of C")
    group.add_argument("--n", "--N", dest="n", metavar="N", type=positive_int, help="columns of C")
    group.add_argument("--k", "--K", dest="k", metavar="K", type=positive_int, help="the inner dimension")
    group.add_argument("--dtype", choices=dtypes.DTYPES, help="the element type")
    group.add_argument("--layout", choices=LAYOUTS, help="the storage of A and B")


def _picked(args: argparse.Namespace, problem: Problem) -> bool:
    """Whether a record's problem passes the filters given (all of them)."""
    wanted = {"m": args.m, "n": args.n, "k": args.k, "dtype": args.dtype, "layout": args.layout}
    return all(value is None or getattr(problem, name) == value for name, value in wanted.items())


def _cache_list(args: argparse.Namespace) -> int:
    cache = _cache()
    rows, records = [], []
    for slug in cache.devices():
        for source, record in cache.records(slug):
            if not _picked(args, record.problem_object):
                continue
            status = "stale (its kernel changed)" if record.stale else "ok"
            rows.append((slug, source, record.problem, record.config_name, f"{record.tflops:.1f}",
                         f"{record.ratio:.3f}", record.date[:10], status))
            records.append({**record.to_json(), "device_slug": slug, "source": source, "status": status})
    if args.json:
        print_json(records)
        return 0
    if not rows:
        print(f"no tuned kernels in {cache.directory}" + (f" or {cache.shipped}" if cache.shipped else ""))
        return 0
    print(table(("device", "source", "problem", "config", "TFLOP/s", "vs cuBLAS", "date", "status"), rows))
    return 0


def _cache_show(args: argparse.Namespace) -> int:
    filters = [f"--{name} {value}" for name in ("m", "n", "k", "dtype", "layout") if (value := getattr(args, name))]
    if args.key is None and not filters:
        raise CliError("cache show needs a problem key, or filters (--m, --n, --k, --dtype, --layout) to pick problems")
    cache = _cache()
    matches = [{"device": slug, "source": source, **record.to_json()}
               for slug in cache.devices() for source, record in cache.records(slug)
               if (args.key is None or record.problem == args.key) and _picked(args, record.problem_object)]
    if not matches:
        raise CliFailure(f"no cached entry for {' '.join(([args.key] if args.key else []) + filters)}")
    print_json(matches)
    return 0


def _cache_export(args: argparse.Namespace) -> int:
    try:
        count = _cache().export(args.output)
    except OSError as exc:
        raise CliFailure(f"cannot write {args.output}: {exc}") from None
    print(f"exported {count} records to {args.output}")
    return 0


def _cache_import(args: argparse.Namespace) -> int:
    cache = _cache()
    try:
        count = cache.import_bundle(args.file)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:  # CacheWriteError: what was written before, and the directory that refused
        raise CliFailure(str(exc)) from None
    print(f"merged {count} records from {args.file} into {cache.directory}")
    return 0


def _cache_clear(args: argparse.Namespace) -> int:
    cache = _cache()
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError("cache clear deletes every tuned result in " f"{cache.directory}; add --yes to confirm")
        answer = input(f"delete every tuned result in {cache.directory}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    try:
        removed = cache.clear()
    except OSError as exc:
        raise CliFailure(f"cannot clear the cache directory {cache.directory}: {exc}") from None
    print(f"removed {len(removed)} cache files from {cache.directory}")
    return 0


def _cache_merge(sources: list[str], output: str | None, replace: bool = False) -> int:
    if not sources:
        raise CliError("cache merge needs the cache files to merge (device documents or exports)")
    try:
        counts = merge_files(sources, output, replace)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliFailure(f"cannot write {output}: {exc}") from None
    print(f"merged {len(sources)} file(s) into {output}: " + ", ".join(f"{n} records of {slug}" for slug, n in counts.items()))
    return 0


def _cache_retime(cache, file, force: bool, only) -> int:
    """Re-times this GPU's records of a device document (the user's, or FILE) under the current timing
    protocol (retime.py)."""
    require_gpu()
    device = launch.current_device()
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


# Each record's kernel is verified in a fresh measuring process, and a first request on a fresh machine also
# pays the process's one-time work (CuPy compiling the check's kernels: isolate.FIRST_REQUEST_SLACK_S, the
# allowance a tune's first candidate gets). `cache verify --all` on a fresh H100 called the first generated
# kernel of its document hung after a small problem's 10 s candidate limit, and verified the 189 after it. So
# each verification, a process's only request, gets at least that allowance; a kernel that does hang is still
# reported, later.
VERIFY_TIMEOUT_S = FIRST_REQUEST_SLACK_S


def _cache_verify(cache, include_shipped: bool) -> int:
    """Re-verifies every current record of this GPU; drops the user's that fail."""
    require_gpu()
    device = launch.current_device()
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
            evaluator = IsolatedEvaluator(problem, device, jobs=1,
                                          timeout=max(candidate_timeout(problem, device), VERIFY_TIMEOUT_S))
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
