"""The command line as pip, git and pytest users expect it (issue 65): bare `autogemm` prints its help, a
mistyped command gets a "did you mean", the problem flags are spelled in lower case (the upper-case ones
stay as aliases), -o OUT is the one required spelling of the file a command writes, and "no usable GPU"
is said one way, naming the command."""

from __future__ import annotations

import pytest

from autogemm.cli import main

from conftest import gpu_available
from test_cli_hardening import _fake_cupy


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's exits (usage errors, --help)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_bare_autogemm_prints_its_help(capsys):
    code, out, err = run(capsys)
    assert code == 0 and out.startswith("usage: autogemm") and "COMMAND" in out and "tune" in out and not err
    for command in ("cache", "campaign"):  # a command of actions, bare: its own help
        code, out, err = run(capsys, command)
        assert code == 0 and out.startswith(f"usage: autogemm {command}") and "ACTION" in out and not err


@pytest.mark.parametrize("argv, suggestion", [(["tnue"], "'tune'"), (["rendr"], "'render'"),
                                               (["cache", "lsit"], "'list'"), (["campaign", "rn", "x.toml"], "'run'")])
def test_a_mistyped_command_gets_did_you_mean(capsys, argv, suggestion):
    code, _, err = run(capsys, *argv)
    assert code == 2 and f"did you mean {suggestion}?" in err


def test_a_command_unlike_any_gets_the_list_without_a_guess(capsys):
    code, _, err = run(capsys, "xyzzy")
    assert code == 2 and "unknown command 'xyzzy'" in err and "did you mean" not in err and "tune" in err


def test_problem_flags_are_documented_in_lower_case_and_the_upper_case_ones_still_work(capsys):
    from autogemm.cli import build_parser

    _, out, _ = run(capsys, "tune", "--help")
    assert "--m M, --M M" in out and "--n N, --N N" in out and "--k K, --K K" in out
    assert "usage: autogemm tune [-h] --m M" in " ".join(out.split())
    for spelling in (["--m", "64", "--n", "32", "--k", "16"], ["--M", "64", "--N", "32", "--K", "16"]):
        args = build_parser().parse_args(["tune", *spelling])
        assert (args.m, args.n, args.k) == (64, 32, 16)


@pytest.mark.parametrize("argv", [["report", "--all"], ["cache", "export"], ["cache", "merge", "a.json"],
                                  ["campaign", "export", "c.toml"]])
def test_every_command_that_writes_a_file_requires_o_and_says_so(capsys, argv):
    code, _, err = run(capsys, *argv, "--help")
    _, out, _ = run(capsys, *argv, "--help")
    usage = " ".join(out.split("\n\n")[0].split())
    assert " -o OUT" in usage and "[-o OUT]" not in usage, usage
    assert "-o OUT, --output OUT" in out and "(required)" in out
    code, _, err = run(capsys, *argv)
    assert code == 2 and "the following arguments are required: -o/--output" in err


def test_cache_export_writes_the_file_o_names(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path))
    code, out, _ = run(capsys, "cache", "export", "-o", str(tmp_path / "bundle.json"))
    assert code == 0 and (tmp_path / "bundle.json").is_file() and "exported" in out


@pytest.mark.parametrize("argv, name", [(["tune", "--m", "64"], "tune"), (["bench", "--m", "64"], "bench"),
                                         (["cache", "verify"], "cache verify"), (["cache", "retime"], "cache retime")])
def test_no_usable_gpu_is_said_one_way_naming_the_command(capsys, monkeypatch, argv, name):
    from autogemm.gpu import runtime

    no_driver = _fake_cupy(0, error="cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA "
                                    "runtime version")
    monkeypatch.setattr(runtime, "cupy", lambda: no_driver)
    code, _, err = run(capsys, *argv)
    assert code == 3
    assert err.strip() == (f"autogemm {name}: error: autogemm {name} needs a CUDA GPU, and no CUDA GPU is usable "
                           "on this host (no CUDA driver is installed)")


@pytest.mark.skipif(gpu_available()[0], reason="this machine has a GPU: the campaign would run")
def test_a_campaign_without_a_driver_says_it_the_same_way(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path / "user"))
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\nname = "x"\n[[problems]]\nM = 64\n')
    code, _, err = run(capsys, "campaign", "run", str(path))
    assert code == 3 and "autogemm campaign run: error: autogemm campaign run needs a CUDA GPU, and no CUDA GPU is " \
                         "usable on this host (" in err
    assert "DynamicLibNotFoundError" not in err


# ---- cache list and show pick problems by their sizes, dtype and layout ---------------------------------
def _three_records(tmp_path):
    import dataclasses

    from autogemm.problem import Problem
    from autogemm.results.cache import TuningCache
    from test_cache import SLUG, make_record

    cache = TuningCache(tmp_path / "tuned", shipped=False)
    for problem in (Problem(64, 64, 64), Problem(128, 64, 64), Problem(64, 64, 64, trans_b=True)):
        cache.store(dataclasses.replace(make_record(64), problem=problem.key), SLUG)
    return SLUG


def test_cache_list_and_show_take_problem_filters(capsys, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path))
    slug = _three_records(tmp_path)
    code, out, _ = run(capsys, "cache", "list", "--json", "--m", "64")
    mine = sorted(r["problem"] for r in json.loads(out) if r["device_slug"] == slug)
    assert code == 0 and mine == ["float32/fp32/nn/b1/64x64x64", "float32/fp32/nt/b1/64x64x64"]
    code, out, _ = run(capsys, "cache", "list", "--m", "64", "--layout", "nt", "--dtype", "float32")
    assert code == 0 and "float32/fp32/nt/b1/64x64x64" in out and "nn/b1/64x64x64" not in out
    code, out, _ = run(capsys, "cache", "show", "--M", "128", "--n", "64")
    assert code == 0 and [r["problem"] for r in json.loads(out) if r["problem"].endswith("128x64x64")] == \
        ["float32/fp32/nn/b1/128x64x64"]
    code, _, err = run(capsys, "cache", "show", "--m", "999")
    assert code == 3 and "no cached entry for --m 999" in err
    code, _, err = run(capsys, "cache", "show")
    assert code == 2 and "needs a problem key, or filters" in err


# ---- each --help says what holds for its own command ------------------------------------------------
@pytest.mark.parametrize("command", ["render", "check", "tune", "bench", "report"])
def test_each_help_carries_only_its_own_commands_notes(capsys, command):
    _, out, _ = run(capsys, command, "--help")
    text = " ".join(out.split())
    timed = command in ("tune", "bench")
    for note in ("timed against torch._scaled_mm", "timed against torch._grouped_mm", "timed with the epilogue"):
        assert (note in text) == timed, (command, note)
    assert ("the space is for" in text) == (command == "check")
    assert "for check --space" not in text
