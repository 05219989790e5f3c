"""The `autogemm` command: a thin argparse layer over the library. One module per group of
commands (`kernels`: render, check; `tuning`: tune, bench; `cache`; `campaign`; `report`; `native`); this one builds
the parser."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import sys

from ..families import SimtConfig
from ..gpu.runtime import GpuUnavailable
from ..version import __version__
from .arguments import EXIT_CANNOT_RUN, EXIT_USAGE, CliError, CliFailure, add_problem_arguments, positive_int
from .cache import add_cache_parser
from .campaign import add_campaign_parser
from .kernels import cmd_check, cmd_render
from .native import add_native_parser
from .report import add_report_parser
from .tuning import add_bench_parser, add_tune_parser
from .output import print_json


class Parser(argparse.ArgumentParser):
    """argparse's parser, with a "did you mean" for a mistyped command or action (the nested parsers
    of `cache` and `campaign` are of this class too: add_subparsers makes its parsers so)."""

    def _check_value(self, action, value):
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            close = difflib.get_close_matches(value, list(action.choices), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise argparse.ArgumentError(action, f"unknown {action.metavar.lower()} {value!r}{hint} "
                                                 f"(choose from {', '.join(action.choices)})")
        super()._check_value(action, value)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="autogemm",
        description="Generate, tune and serve CUDA GEMM kernels. Kernels are rendered from Jinja2 "
        "templates, compiled with NVRTC, searched with Optuna per problem "
        "and device, verified against a float64 reference, and cached.",
        epilog="Exit status: 0 done; 1 the command ran and found failures (variants that spill, cached "
        "kernels that are wrong); 2 a usage error (arguments, a config, a file given); 3 the command could "
        "not run (no GPU or CuPy, nothing cached, the tune failed). With --json, an error is also printed "
        "as {\"error\": ..., \"exit_code\": ...}.",
    )
    parser.add_argument("--version", action="version", version=f"autogemm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")  # (none: the help, as pip and git print it)

    render_p = sub.add_parser("render", help="print the CUDA source of one configuration",
                              description="Print the CUDA source that a configuration renders to. The "
                              "problem only decides the layout and which tails need bounds checks.")
    render_p.add_argument("--config", required=True,
                          help=f"JSON object of knobs (missing ones default), e.g. '{{\"bm\": 64}}', or a name like {SimtConfig().name}")
    render_p.add_argument("--arch", help="validate against this architecture's limits (default sm_90)")
    render_p.add_argument("--force", action="store_true",
                          help="render even if check() rejects the config or a knob is out of its range "
                               "(for experiments; knobs of the wrong type are refused all the same)")
    add_problem_arguments(render_p, m_required=False, default_size=4096)
    render_p.set_defaults(handler=cmd_render)

    check_p = sub.add_parser("check", help="compile a sample of a search space and report resources",
                             description="Render and compile a sample of a search space with NVRTC, as kernels "
                             "are compiled to be served (or with the CUDA toolkit's nvcc where NVRTC's package "
                             "is missing; no GPU needed), and print ptxas's registers, spills and shared memory "
                             "per variant. A variant that "
                             "spills under its own max_registers is reported as refused (the loader refuses it, "
                             "as a tune does). Exits 1 where a variant fails to compile or spills without a "
                             "register cap (and, with --strict, where any variant spills).")
    check_p.add_argument("--space", help="search-space TOML file or shipped name (default: the space of the family "
                         "that serves the problem: the dtype's own, or for --groups the Hopper family's)")
    check_p.add_argument("--strict", action="store_true",
                         help="also fail (exit 1) where a variant is refused for spilling under its max_registers")
    check_p.add_argument("--arch", default="sm_90", help="target architecture (default sm_90)")
    check_p.add_argument("--count", type=positive_int, default=12, help="variants to compile (default 12)")
    check_p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    check_p.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1, help="parallel compiles")
    check_p.add_argument("--json", action="store_true", help="print the variants' resources as JSON instead of a table")
    add_problem_arguments(check_p, m_required=False, default_size=4096,
                          dtype_note="float32; with --space, the first the space is for")
    check_p.set_defaults(handler=cmd_check)

    add_tune_parser(sub)
    add_bench_parser(sub)

    add_campaign_parser(sub)
    add_report_parser(sub)

    add_cache_parser(sub)
    add_native_parser(sub)
    return parser


# a reader that closed the pipe (`autogemm cache list --json | head`): what a shell reports for a
# program that SIGPIPE ended, as the tools of a pipeline do
EXIT_CLOSED_PIPE = 141


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record comes (as logging's last resort does), so that
    a redirected or captured stderr gets the lines."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _show_status() -> None:
    """The library's status lines (logger "autogemm", INFO and above) on stderr, once per process: a
    library leaves its logging to its caller, and the command line is the caller here."""
    logger = logging.getLogger("autogemm")
    if not any(isinstance(handler, _StderrHandler) for handler in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    _show_status()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return _run(args)
    except BrokenPipeError:
        # the reader has what it wanted: no traceback, and nothing more written to the closed pipe
        # (Python flushes stdout again at exit, which would raise once more)
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


def _run(args) -> int:
    try:
        return args.handler(args)
    except (CliError, CliFailure, GpuUnavailable) as exc:  # (the GPU lost past a command's own check, too)
        code = EXIT_USAGE if isinstance(exc, CliError) else EXIT_CANNOT_RUN
        name = " ".join(part for part in (args.command, getattr(args, "action", None)) if part)
        if isinstance(exc, GpuUnavailable):  # one wording, whatever is missing: the command and what it needs
            exc = f"autogemm {name} needs a CUDA GPU, and {exc}"
        print(f"autogemm {name}: error: {exc}", file=sys.stderr)
        if getattr(args, "json", False):  # what reads the JSON learns of the failure as JSON
            print_json({"error": str(exc), "exit_code": code}, indent=None)
        return code
    except KeyboardInterrupt:
        print(f"autogemm {args.command}: interrupted", file=sys.stderr)
        return 130
