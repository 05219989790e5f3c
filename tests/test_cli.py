from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autogemm.cli import main
from autogemm.families import SimtConfig


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_render_prints_source_for_json_config(capsys):
    code, out, _ = run_cli(capsys, "render", "--config", json.dumps({"bm": 64, "bn": 64, "wm": 32, "wn": 32, "tm": 4}))
    assert code == 0
    assert "ag_simt_64x64x8_w32x32_t4x8" in out
    assert "__global__" in out


def test_render_json_config_takes_the_family_of_the_dtype(capsys):
    knobs = {"instruction": "mma", "bm": 64, "bn": 64, "wm": 32, "wn": 32}
    code, out, _ = run_cli(capsys, "render", "--config", json.dumps(knobs), "--dtype", "float16")
    assert code == 0
    assert "ag_wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o1_mma_float16" in out and "mma.sync.aligned.m16n8k16" in out
    # FP64 mma.sync is an sm_90 instruction: refused for sm_80 with the reason
    code, _, err = run_cli(capsys, "render", "--config", json.dumps({**knobs, "vec": 2, "bk": 16}),
                           "--dtype", "float64", "--arch", "sm_80")
    assert code == 2 and "mma.sync needs compute capability 9.0" in err


def test_render_accepts_a_config_name_and_layout(capsys):
    name = SimtConfig(stages=3).name
    code, out, _ = run_cli(capsys, "render", "--config", name, "--layout", "tt", "--M", "100")
    assert code == 0 and "_tt_" in out and "cp.async" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["render", "--config", "{bad json"], "--config is not valid JSON"),
        (["render", "--config", '{"colour": 1}'], "unknown SIMT config knobs: colour"),
        (["render", "--config", '{"tm": 4}'], "warp-lanes"),
        (["render", "--config", "{}", "--layout", "nt", "--trans-a"], "either --layout or --trans-a"),
        (["render", "--config", "{}", "--dtype", "float16", "--compute", "fp64"], "float16"),
        (["render", "--config", '{"family": "wmma", "colour": 1}'], "unknown WMMA config knobs: colour"),
        (["render", "--config", "wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o1"], "dtype: the WMMA template computes"),
        (["tune", "--M", "64", "--dtype", "float16", "--space", "simt"], "a simt space cannot compute float16/fp32"),
        (["render", "--config", '{"group_m": 4294967296}'], "group_m=4294967296 must be 1 to 1024"),
        (["render", "--config", '{"bm": 1.5}'], "bm=1.5 must be an int"),
        (["render", "--force", "--config", '{"stream_k": 1}'], "stream_k=1 must be true or false"),
        (["render", "--config", "128x128x8_w32x64_t8x8_v44_s2_pad_g0_k1_o1"], "group_m=0 must be 1 to 1024"),
    ],
)
def test_render_errors_are_clear(capsys, argv, message):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err


@pytest.mark.parametrize(
    "value,message", [("0", "must be >= 1, got 0"), ("abc", "expected a positive integer, got 'abc'")]
)
def test_bad_sizes_are_rejected_by_the_parser(capsys, value, message):
    with pytest.raises(SystemExit) as info:
        main(["render", "--config", "{}", "--M", value])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--dtype", "int8"], "invalid choice: 'int8'"),
    (["--compute", "fp8"], "invalid compute mode 'fp8' (choose from fp32, tf32, fp64)"),
])
def test_dtypes_and_compute_modes_are_choices_the_help_lists(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(["render", "--config", "{}", *argv])
    assert info.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    help_text = capsys.readouterr().out
    assert "--dtype {float32,float16,bfloat16,float64,float8_e4m3fn,float8_e5m2}" in help_text and "--compute {fp32,tf32,fp64}" in help_text
    assert "--layout {nn,nt,tn,tt}" in help_text


@pytest.mark.parametrize("value,message", [("-1", "must be >= 0, got -1"), ("x", "expected a whole number >= 0")])
def test_a_bad_patience_is_rejected_by_the_parser(capsys, value, message):
    with pytest.raises(SystemExit) as info:
        main(["tune", "--M", "64", "--patience", value])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_check_compiles_a_sample_and_says_with_what(capsys):
    code, out, err = run_cli(capsys, "check", "--count", "2", "--arch", "sm_90", "--seed", "4")
    assert code == 0, out + err
    assert "with NVRTC 1" in err  # (the CUDA extra's NVRTC, as kernels are served)
    rows = [line for line in out.splitlines() if line.startswith(tuple("123456789"))]
    assert len(rows) == 2
    assert "2/2 variants compiled without spills" in err


def test_check_prints_its_variants_as_json(capsys):
    code, out, err = run_cli(capsys, "check", "--count", "2", "--arch", "sm_90", "--seed", "4", "--json")
    assert code == 0, out + err
    report = json.loads(out)  # nothing but the JSON document on stdout
    assert (report["arch"], report["failures"]) == ("sm_90", 0) and report["space"] == "simt.toml"
    assert len(report["variants"]) == 2
    for variant in report["variants"]:
        assert variant["registers"] > 0 and variant["spills"] is False and variant["shared_bytes"] > 0


def test_console_script_help():
    result = subprocess.run([sys.executable, "-m", "autogemm.cli", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    assert "render" in result.stdout and "check" in result.stdout


def test_exit_codes_tell_usage_errors_from_commands_that_cannot_run(capsys):
    assert run_cli(capsys, "render", "--config", '{"bm": 1.5}')[0] == 2  # a usage error
    with pytest.raises(SystemExit) as info:
        main(["tune"])  # argparse: --M missing
    assert info.value.code == 2
    capsys.readouterr()
    # nothing cached on this machine (or no GPU): the command cannot run
    code, _, err = run_cli(capsys, "cache", "show", "float32/fp32/nn/b1/7x7x7")
    assert code == 3 and "no cached entry" in err


def test_json_commands_report_errors_as_json(capsys):
    code, out, _ = run_cli(capsys, "tune", "--M", "64", "--dtype", "float16", "--space", "simt", "--json")
    assert code == 2
    assert json.loads(out) == {"error": json.loads(out)["error"], "exit_code": 2}
    assert "cannot compute float16/fp32" in json.loads(out)["error"]


def test_matmul_refuses_scalars_that_are_not_real_numbers():
    pytest.importorskip("cupy", reason="matmul needs CuPy (the cuda13 or cuda12 extra); no GPU needed here")
    import autogemm

    fake = type("Fake", (), {"__cuda_array_interface__": {"shape": (4, 4), "typestr": "<f4", "data": (1 << 32, False),
                                                           "version": 3}})()
    with pytest.raises(TypeError, match="alpha must be a real number, got str '2'"):
        autogemm.matmul(fake, fake, alpha="2")


def test_version_and_python_dash_m_autogemm(capsys):
    import subprocess
    import sys

    from autogemm.version import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"autogemm {__version__}"
    run = subprocess.run([sys.executable, "-m", "autogemm", "--version"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == f"autogemm {__version__}"


def test_cache_list_as_json(tmp_path, capsys, monkeypatch):
    import json

    from autogemm.results.cache import TuningCache
    from test_cache import SLUG, make_record

    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path))
    TuningCache(tmp_path / "tuned", shipped=False).store(make_record(64, ratio=1.25), SLUG)
    assert main(["cache", "list", "--json"]) == 0
    listed = [r for r in json.loads(capsys.readouterr().out) if r["device_slug"] == SLUG]
    assert len(listed) == 1
    assert listed[0]["source"] == "user" and listed[0]["status"] == "ok" and listed[0]["ratio"] == 1.25


def test_the_license_file_is_the_declared_license():
    import tomllib
    from pathlib import Path

    root = Path(__file__).parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    # an SPDX expression (PEP 639; the table form is deprecated) and the file it ships
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (root / "LICENSE").read_text().startswith("MIT License")


def test_tune_progress_is_a_line_per_interval_where_stderr_is_not_a_terminal(monkeypatch):
    import io

    from autogemm.tuning import progress as tune_progress
    from autogemm.problem import Problem

    class Evaluator:
        cublas_ms = 2.0

    clock = [100.0]
    monkeypatch.setattr(tune_progress.time, "monotonic", lambda: clock[0])
    stream = io.StringIO()
    progress = tune_progress.TuneProgress(True, 50, Problem(64, 64, 64), Evaluator(), stream=stream)
    for step in range(30):  # a trial every second
        clock[0] += 1.0
        progress.update(True, 1.0, rejected=2, failed=step // 10)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()  # no bar redrawn in place
    assert lines[0].endswith("up to 50 trials")
    assert len(lines) == 1 + 3 + 1  # the start, one line per 10 s, the end
    assert "10/50 trials, 10 s, best" in lines[1] and "2.000x cuBLAS" in lines[1]
    assert lines[-1].startswith("tuning 64×64×64") and "30/50 trials" in lines[-1] and "failed 2" in lines[-1]


def test_check_takes_the_dtype_a_space_declares(capsys):
    code, out, err = run_cli(capsys, "check", "--space", "wmma_bf16", "--count", "1", "--arch", "sm_90")
    assert code == 0, out + err
    assert "variants of wmma_bf16.toml for" in err and "bfloat16/fp32" in err
    code, _, err = run_cli(capsys, "check", "--space", "wmma_bf16", "--dtype", "float32")
    assert code == 2
    assert "--space wmma_bf16 is for bfloat16/fp32, not float32/fp32" in err


def test_the_check_table_fits_its_longest_config_name(capsys):
    # (seed 4 draws a 50-character name, longer than the 48 the column once had)
    code, out, err = run_cli(capsys, "check", "--space", "hopper", "--count", "2", "--arch", "sm_90", "--seed", "4")
    assert code == 0, out + err
    lines = [line for line in out.splitlines() if line.strip() and not line.startswith("-")]
    header, rows = lines[0], lines[1:]
    assert len(rows) == 2
    column = header.index("regs") + len("regs")  # right-aligned under its header, whatever the name's length
    for row in rows:
        name, registers = row.split()[0], row.split()[1]
        assert row.index(name) == 0 and row[:column].rstrip().endswith(registers), row


def test_cache_and_campaign_arguments_that_cannot_work_are_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path))
    assert main(["cache", "merge", "-o", str(tmp_path / "out.json")]) == 2
    assert "cache merge needs the cache files to merge" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # each cache action takes its own arguments only
        main(["cache", "show", "a", "b"])
    assert info.value.code == 2 and "unrecognized arguments: b" in capsys.readouterr().err
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\nname = "x"\n[[problems]]\nM = 64\n')
    with pytest.raises(SystemExit) as info:
        main(["campaign", "export", str(path)])
    assert info.value.code == 2 and "the following arguments are required: -o/--output" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["campaign", "run", str(path), "--stop-after", "-5"])
    assert info.value.code == 2 and "must be a positive number of seconds, got '-5'" in capsys.readouterr().err


def test_the_tune_flags_are_the_tune_options_with_their_defaults():
    """`autogemm tune` asks for TuneOptions' defaults where no flag is given (its --jobs shows this
    machine's cores, which is what the options' None means), and each flag sets its option."""
    from autogemm.cli import build_parser
    from autogemm.cli.tuning import tune_options_from
    from autogemm.tuning.options import TuneOptions, default_jobs

    args = build_parser().parse_args(["tune", "--M", "64"])
    assert tune_options_from(args, None) == TuneOptions(jobs=default_jobs())
    args = build_parser().parse_args(["tune", "--M", "64", "--trials", "9", "--timeout", "2.5", "--patience", "0",
                                      "--seed", "3", "--sampler", "random", "--storage", ":memory:", "--study-name",
                                      "s", "--jobs", "2", "--candidate-timeout", "4", "--no-isolation"])
    assert tune_options_from(args, "simt") == TuneOptions(
        trials=9, timeout=2.5, patience=0, seed=3, sampler="random", space="simt", storage=":memory:",
        study_name="s", jobs=2, isolate=False, candidate_timeout=4.0)
