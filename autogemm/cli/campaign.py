"""`autogemm campaign run|status|export FILE`: many problems over every GPU of this host (and, through
a shared storage, of other hosts), with a line per GPU while it runs and a table at the end; each
action an argparse subcommand with its own help and only its own options."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..campaigns.file import CampaignFileError, load_campaign
from ..results.cache import TuningCache
from ..results.merge import write_documents
from ..results.url_secrets import hide_passwords, shown_url
from ..tuning.options import default_jobs
from .arguments import EXIT_FAILURES, CliError, CliFailure, add_output_argument, positive_int, positive_seconds
from .tables import table
from .output import print_json


class CampaignView:
    """What a campaign shows while it runs: one tqdm line per GPU on a terminal (problems done, the
    one being tuned, its trials and best ratio so far); a line per event where stderr is not a
    terminal (a log file, CI)."""

    def __init__(self, labels: list[str], total: int, stream: Any = None):
        self.stream = stream or sys.stderr
        self.total = total
        self.state = {label: self._fresh() for label in labels}
        self.bars = {}
        self.failed: list[str] = []
        if self.stream.isatty():
            from tqdm import tqdm  # (lazy: only progress display needs it)

            self.bars = {label: tqdm(total=total, position=i, desc=label, unit="problem", dynamic_ncols=True,
                                     file=self.stream, leave=True) for i, label in enumerate(labels)}

    @staticmethod
    def _fresh() -> dict:
        """A GPU's line before its first event: nothing done, nothing being tuned."""
        return {"done": 0, "current": "", "since": 0.0, "trials": 0, "ratio": None}

    def _line(self, label: str, text: str) -> None:
        if self.bars:
            self.bars[label].set_postfix_str(text[:120], refresh=True)
        else:
            print(f"{time.strftime('%H:%M:%S')} {label}: {text}", file=self.stream, flush=True)

    def event(self, event: tuple) -> None:
        kind, label, *rest = event
        state = self.state.setdefault(label, self._fresh())
        if kind == "ready":
            self._line(label, f"{rest[0]} ready")
        elif kind == "start":
            state.update(current=rest[0], since=time.monotonic(), trials=0, ratio=None)
            self._line(label, f"tuning {rest[0]}")
        elif kind == "trial":
            state.update(trials=rest[1], ratio=rest[3])
            if self.bars:
                self.tick()
        elif kind == "done":
            state["done"] += 1
            summary = rest[1]
            if self.bars:
                self.bars[label].update(1)
            kept = " (kept cuBLAS)" if summary.get("kept_cublas") else ""
            self._line(label, f"done {rest[0]}: {summary['config']} {summary['tflops']:.1f} TFLOP/s, "
                              f"{summary['ratio']:.3f}x cuBLAS{kept}")
        elif kind == "helping":  # nothing left to claim: searching another GPU's study beside it
            state.update(current=f"{rest[0]} (helping)", since=time.monotonic(), trials=0, ratio=None)
            self._line(label, f"helping {rest[0]}")
        elif kind in ("failed", "skipped", "stopped", "lost"):
            if kind == "failed":
                self.failed.append(rest[0])
            self._line(label, f"{kind} {rest[0]}: {rest[1]}")
        elif kind == "error":
            self.failed.append(label)
            self._line(label, f"worker failed: {rest[0]}")

    def tick(self) -> None:
        if not self.bars:
            return
        for label, state in self.state.items():
            if state["current"] and label in self.bars:
                ratio = f", best {state['ratio']:.3f}x" if state["ratio"] else ""
                self.bars[label].set_postfix_str(f"{state['current']} {time.monotonic() - state['since']:.0f} s, "
                                                 f"{state['trials']} trials{ratio}", refresh=True)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def _table(rows: list[dict]) -> str:
    def cell(value, form="{}"):
        return "-" if value is None or value == "" else form.format(value)

    header = ("device", "problem", "state", "config", "TFLOP/s", "cuBLAS TFLOP/s", "ratio", "host")
    body = [(r["device"], r["problem"], r["state"] + (" (cuBLAS kept)" if r["kept_cublas"] else "")
             + (f" error: {r['error'][:60]}" if r["error"] else ""),
             cell(r["config"]), cell(r["tflops"], "{:.1f}"), cell(r["cublas_tflops"], "{:.1f}"),
             cell(r["ratio"], "{:.3f}"), cell(r["host"])) for r in rows]
    return table(header, body)


def _load(args: argparse.Namespace):
    """The campaign file named on the command line, checked (a fault is a usage error)."""
    try:
        return load_campaign(args.file, trust_cache_dir=args.trust_cache_dir, cache_dir=getattr(args, "cache_dir", None))
    except CampaignFileError as exc:
        raise CliError(hide_passwords(str(exc))) from None


def _cannot_read(storage: str, exc: Exception) -> CliFailure:
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return CliFailure(hide_passwords(f"cannot read the campaign's claims from {shown_url(storage)}: "
                                     f"{type(exc).__name__}: {first}", storage))


def _results(campaign, storage: str) -> list[dict]:
    """The campaign's rows: the board's (read without creating anything) and the campaign cache's."""
    from ..campaigns.campaign import board_summary  # (lazy: SQLAlchemy)
    from ..campaigns.claims import BoardReader  # (lazy: SQLAlchemy)

    try:
        board = BoardReader(storage)
        try:
            rows = board_summary(board, campaign, cache=TuningCache(campaign.cache_dir, shipped=False))
        finally:
            board.close()
    except Exception as exc:  # SQLAlchemy's errors, whatever the database
        raise _cannot_read(storage, exc) from None
    for row in rows:  # (rows written before errors were kept without passwords)
        row["error"] = hide_passwords(row["error"], storage)
    return rows


def _show(campaign, rows: list[dict], as_json: bool) -> None:
    from ..campaigns.campaign import progress_lines  # (lazy: SQLAlchemy)

    if as_json:
        print_json({"campaign": campaign.name, "problems": len(campaign.problems), "results": rows})
    elif rows:
        print(_table(rows))
    else:
        print(f"campaign {campaign.name}: nothing on the board yet (no worker has started)")
    for line in progress_lines(campaign, rows):
        print(line, file=sys.stderr)


def cmd_campaign_run(args: argparse.Namespace) -> int:
    # (lazy: SQLAlchemy)
    from ..campaigns.campaign import (CampaignError, list_gpus, resolve_storage, run_campaign, select_gpus,
                                      storage_advice, worker_specs)

    campaign = _load(args)
    storage = resolve_storage(campaign)
    try:
        gpus = select_gpus(campaign.devices, list_gpus())
    except CampaignError as exc:
        raise CliFailure(str(exc)) from None
    stop_at = time.time() + args.stop_after if args.stop_after else None
    specs = worker_specs(campaign, storage, gpus, args.jobs or default_jobs(), stop_at)
    print(f"campaign {campaign.name}: {len(campaign.problems)} problems on {len(gpus)} GPU(s) of this host "
          f"({', '.join(f'{g.index} {g.name}' for g in gpus)}); storage {shown_url(storage)}", file=sys.stderr)
    advice = storage_advice(storage, len(specs))
    if advice:
        print(f"campaign {campaign.name}: note: {advice}", file=sys.stderr)
    view = None if args.json else CampaignView([s.label for s in specs], len(campaign.problems))
    try:
        codes = run_campaign(campaign, specs, view)
    finally:
        if view is not None:
            view.close()
    broken = [label for label, code in codes.items() if code != 0]
    if broken:
        print(f"campaign {campaign.name}: worker(s) {', '.join(broken)} ended with an error", file=sys.stderr)
    rows = _results(campaign, storage)
    _show(campaign, rows, args.json)
    return EXIT_FAILURES if broken or any(r["error"] for r in rows) else 0


def cmd_campaign_status(args: argparse.Namespace) -> int:
    from ..campaigns.campaign import resolve_storage  # (lazy: SQLAlchemy)

    campaign = _load(args)
    _show(campaign, _results(campaign, resolve_storage(campaign, create=False)), args.json)
    return 0


def cmd_campaign_export(args: argparse.Namespace) -> int:
    """Writes the records on the board (every host's) as one cache file."""
    from ..campaigns.campaign import board_records, resolve_storage  # (lazy: SQLAlchemy)
    from ..campaigns.claims import BoardReader  # (lazy: SQLAlchemy)

    campaign = _load(args)
    storage = resolve_storage(campaign, create=False)
    try:
        board = BoardReader(storage)
        try:
            documents = board_records(board, campaign)
        finally:
            board.close()
    except Exception as exc:  # SQLAlchemy's errors, whatever the database
        raise _cannot_read(storage, exc) from None
    if not documents:
        raise CliFailure(f"campaign {campaign.name} has no finished record on the board yet")
    try:
        write_documents(documents, args.output)
    except OSError as exc:
        raise CliFailure(f"cannot write {args.output}: {exc}") from None
    print(f"exported {', '.join(f'{len(e)} records of {slug}' for slug, e in documents.items())} to {args.output}")
    return 0


_TRUST = ("accept a cache_dir or a file storage (sqlite:///, journal:///) in the campaign file that is an absolute "
          "path outside the file's folder (without it, they must lie inside its folder, so that a campaign file "
          "from someone else decides nothing about where anything is written); also --trust-cache-dir")


def add_campaign_parser(sub: Any) -> None:
    campaign_p = sub.add_parser(
        "campaign", help="tune many problems over every GPU of this host and over hosts sharing a storage",
        description="Tune every problem of a campaign file (TOML: [campaign] with name, storage, devices, timeout, "
        "trials, seed, grace, patience, cache_dir; [[problems]] grids or shapes) on this host's GPUs, and follow it. "
        "See `autogemm campaign ACTION --help` for each action's options.")
    actions = campaign_p.add_subparsers(dest="action", metavar="ACTION")
    campaign_p.set_defaults(handler=lambda args: campaign_p.print_help() or 0)  # no action: its help (an action's handler replaces it)
    run_p = actions.add_parser(
        "run", help="tune the campaign's problems on this host's GPUs",
        description="Tune every problem of a campaign file on this host's GPUs, one worker process per GPU. Hosts "
        "given the same storage URL (PostgreSQL) share the problems: each is tuned once per GPU model. Results land "
        "in the cache as they are found (the campaign's cache_dir, a folder inside the file's own). Ctrl-C keeps "
        "each GPU's best so far and gives its problem back; running the command again resumes. Ends with the "
        "table of results.")
    status_p = actions.add_parser(
        "status", help="the table of results so far",
        description="The table of the campaign's results so far: every host's, from the board in the storage, and "
        "the problems finished in the campaign's cache. Reads only: creates nothing.")
    export_p = actions.add_parser(
        "export", help="the records every host left on the board, as one cache file",
        description="Write the records every host left on the board as one cache file (a device document, or an "
        "export bundle for several GPU models), for `autogemm cache import` or cache/. Reads only the board.")
    for parser in (run_p, status_p, export_p):
        parser.add_argument("file", help="campaign file (TOML)")
        parser.add_argument("--trust-paths", "--trust-cache-dir", dest="trust_cache_dir", action="store_true",
                            help=_TRUST)
    for parser in (run_p, status_p):
        parser.add_argument("--json", action="store_true", help="print the results as JSON" +
                            (" (no progress lines)" if parser is run_p else ""))
        parser.add_argument("--cache-dir", metavar="DIR",
                            help="the campaign's cache: " + ("write results to this directory instead of the "
                                 "campaign's cache_dir (a problem finished there counts as done; shipped results "
                                 "only seed the search)" if parser is run_p else "count the problems finished in "
                                 "this directory instead of the campaign's cache_dir"))
    run_p.add_argument("--jobs", type=positive_int, help="compile workers in all (default: this host's cores), "
                                                          "shared evenly between the GPUs")
    run_p.add_argument("--stop-after", type=positive_seconds, metavar="SECONDS",
                       help="claim no new problem after this many seconds (each GPU finishes the one it tunes); "
                            "the rest waits for the next run")
    add_output_argument(export_p, "the cache file to write")
    run_p.set_defaults(handler=cmd_campaign_run)
    status_p.set_defaults(handler=cmd_campaign_status)
    export_p.set_defaults(handler=cmd_campaign_export)
