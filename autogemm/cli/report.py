"""`autogemm report`: one self-contained HTML page of what tuning found (per problem: the search's
history, the knobs that mattered, the failures, the winner; across problems: a roofline and the
ratio to cuBLAS per shape), optionally with Nsight Compute's figures for the winner and cuBLAS."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..gpu import launch
from ..measure.profile import ProfilerUnavailable, available_metrics, profile_problem, require_profiler
from ..reports.charts import PlotlyMissing, plotly, render_page
from .arguments import CliError, CliFailure, add_output_argument, add_problem_arguments, positive_float, problem_from_args


def add_report_parser(sub: Any) -> None:
    report_p = sub.add_parser(
        "report", help="write an HTML report of tuned problems (history, importances, failures, roofline)",
        description="Write one self-contained HTML file (charts drawn by Plotly, embedded: it opens offline) "
        "about the tuned problems: every record of the cache (the user's and the shipped ones), with the winner's "
        "knobs and figures, and where the study storage has the problem's studies, each study's TFLOP/s trial by "
        "trial with the best so far and cuBLAS, the parameter importances and the failures by kind; across "
        "problems, a roofline against measured ceilings and the ratio to cuBLAS per shape. Needs the extra: pip "
        "install 'autogemm[report]'.")
    add_problem_arguments(report_p, m_required=False)
    report_p.add_argument("--all", action="store_true", help="report every tuned problem (records and studies) instead of one")
    add_output_argument(report_p, "the HTML file to write")
    report_p.add_argument("--storage", help="Optuna storage URL (default: SQLite in the cache directory)")
    report_p.add_argument("--bench", action="append", default=[], metavar="FILE",
                          help="benchmark results (benchmarks/results/*.json) for the shape sweep and the ceilings "
                               "(default: those of the reported devices in this checkout's benchmarks/results/)")
    report_p.add_argument("--bandwidth", type=positive_float, metavar="GB/S",
                          help="the device's memory bandwidth for the roofline (default: one measured in the "
                               "benchmark results; none drawn where none was)")
    report_p.add_argument("--profile", action="store_true",
                          help="also profile each problem's winner and cuBLAS with Nsight Compute (needs ncu on PATH "
                               "and a GPU)")
    report_p.set_defaults(handler=cmd_report)


def _problem(args: argparse.Namespace):
    given = [flag for flag, value in (("--m", args.m), ("--n", args.n), ("--k", args.k), ("--dtype", args.dtype),
                                      ("--compute", args.compute), ("--layout", args.layout),
                                      ("--trans-a", args.trans_a), ("--trans-b", args.trans_b),
                                      ("--batch", args.batch != 1)) if value]
    if args.all:
        if given:
            raise CliError(f"--all reports every study; it takes no problem options (got {', '.join(given)})")
        return None
    if args.m is None:
        raise CliError("name the problem (--m, and --n, --k, --dtype, ... where they differ) or give --all")
    return problem_from_args(args)


def cmd_report(args: argparse.Namespace) -> int:
    from ..reports.report import NothingToReport, ReportInputError, gather  # (lazy: Optuna)

    problem = _problem(args)
    ncu = None
    if args.profile:  # refused before anything is read
        try:
            ncu = require_profiler()
        except ProfilerUnavailable as exc:
            raise CliFailure(str(exc)) from None
    try:
        plotly()
    except PlotlyMissing as exc:
        raise CliFailure(str(exc)) from None
    output = Path(args.output)
    if not output.parent.is_dir():
        raise CliError(f"-o {args.output}: no directory {output.parent}")
    for path in args.bench:
        if not os.path.isfile(path):
            raise CliError(f"--bench {path}: no such file")
    try:
        report = gather(args.storage, problem, bench=[Path(p) for p in args.bench], bandwidth_gbs=args.bandwidth)
    except ReportInputError as exc:
        raise CliError(str(exc)) from None
    except NothingToReport as exc:
        raise CliFailure(str(exc)) from None
    profiles = _profiles(ncu, report) if ncu else {}
    try:
        output.write_text(render_page(report, profiles), encoding="utf-8")
    except OSError as exc:
        raise CliFailure(f"cannot write {args.output}: {exc}") from None
    problems = sum(len(d.problems) for d in report.devices)
    studies = sum(len(p.studies) for d in report.devices for p in d.problems)
    print(f"wrote {args.output}: {problems} problem(s), {studies} stud{'y' if studies == 1 else 'ies'}, "
          f"{len(report.devices)} device(s)" + (f"; {len(report.skipped)} studies not named as autogemm names them"
                                                if report.skipped else ""))
    return 0


def _profiles(ncu: str, report) -> dict:
    """Nsight Compute's figures for the problems of this GPU (the others' kernels cannot run here)."""
    slug = launch.current_device().slug
    metrics = available_metrics(ncu)
    profiles = {}
    for device in report.devices:
        if device.slug != slug:
            print(f"autogemm report: not profiling {device.slug}'s problems: this GPU is {slug}", file=sys.stderr)
            continue
        for problem in device.problems:
            print(f"autogemm report: profiling {problem.problem.key} with ncu", file=sys.stderr)
            profiles[(slug, problem.problem.key)] = profile_problem(ncu, problem.problem, problem.winner, metrics)
    return profiles
