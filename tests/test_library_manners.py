"""autogemm as a library among others (issue 65): its status goes through `logging` (loggers named
autogemm.*) and `warnings`, never print to stderr; Optuna's verbosity is quieted only while autogemm
searches its own studies, the caller's setting back after; and the command line shows the library's
status lines on stderr."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import optuna

import autogemm

PACKAGE = Path(autogemm.__file__).parent
# what writes to a terminal on purpose: the command line, and the progress lines a tune was asked for
MAY_PRINT = {"cli", "tuning/progress.py"}


def _prints_to_stderr(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            for keyword in node.keywords:
                if keyword.arg == "file" and ast.unparse(keyword.value) == "sys.stderr":
                    lines.append(node.lineno)
    return lines


def test_the_library_says_its_status_through_logging_not_print():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.split("/")[0] in MAY_PRINT or relative in MAY_PRINT:
            continue
        found += [f"{relative}:{line}" for line in _prints_to_stderr(path)]
    assert found == [], "print(..., file=sys.stderr) in the library (use logging.getLogger(__name__)): " + ", ".join(found)


def test_a_tune_leaves_the_callers_optuna_verbosity_as_it_was(tmp_path):
    from test_tuner import run

    for verbosity in (optuna.logging.INFO, optuna.logging.DEBUG, optuna.logging.ERROR):
        optuna.logging.set_verbosity(verbosity)
        try:
            run(tmp_path, 3)
            assert optuna.logging.get_verbosity() == verbosity
        finally:
            optuna.logging.set_verbosity(optuna.logging.INFO)


def test_optuna_is_quiet_during_autogemms_search_only():
    from autogemm.tuning.study import optuna_quiet

    optuna.logging.set_verbosity(optuna.logging.INFO)
    with optuna_quiet():
        assert optuna.logging.get_verbosity() == optuna.logging.WARNING
        with optuna_quiet():  # (a second search at once, in another thread: the same)
            pass
        assert optuna.logging.get_verbosity() == optuna.logging.WARNING
    assert optuna.logging.get_verbosity() == optuna.logging.INFO


def test_the_command_line_prints_the_librarys_status_lines(capsys):
    from autogemm.cli import main

    assert main(["cache", "list", "--m", "1"]) == 0
    capsys.readouterr()
    logging.getLogger("autogemm.tuning.search").info("resuming study s (3 configurations measured)")
    logging.getLogger("autogemm.measure.evaluate").warning("autogemm: a warning")
    err = capsys.readouterr().err
    assert "resuming study s (3 configurations measured)\n" in err and "autogemm: a warning\n" in err
