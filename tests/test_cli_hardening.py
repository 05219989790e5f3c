"""Issue 36 (Hardening II), the command line: no GPU or driver is said in those words (from the CLI
and from autogemm.tune), `check` counts in its summary and exit status what its table shows, the
problem flags take lower case too, and errors list the valid choices."""

from __future__ import annotations

import json
import types

import pytest
from conftest import gpu_available

import autogemm
from autogemm.cli import build_parser, main
from autogemm.families import HopperConfig, SimtConfig

NO_GPU = "no CUDA GPU is usable on this host"


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- no GPU or driver ----------------------------------------------------------------------------

def _fake_cupy(driver_version: int, count=None, error: str = ""):
    """A CuPy whose runtime reports `driver_version` and either `count` GPUs or raises `error`."""
    class CUDARuntimeError(RuntimeError):
        pass

    def get_device_count():
        if error:
            raise CUDARuntimeError(error)
        return count

    runtime = types.SimpleNamespace(driverGetVersion=lambda: driver_version, getDeviceCount=get_device_count)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize("fake,message", [
    (_fake_cupy(0, error="cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version"),
     NO_GPU),
    (_fake_cupy(12020, count=0), NO_GPU),
    (_fake_cupy(12020, error="cudaErrorNoDevice: no CUDA-capable device is detected"), NO_GPU),
    (_fake_cupy(11040, error="cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime "
                             "version"), "driver, CUDA 11.4, is too old"),
])
def test_require_gpu_names_what_is_missing(monkeypatch, fake, message):
    from autogemm.gpu import runtime

    monkeypatch.setattr(runtime, "cupy", lambda: fake)
    with pytest.raises(autogemm.GpuUnavailable, match=message.replace("(", r"\(").replace(")", r"\)")):
        runtime.require_gpu()


def test_require_gpu_passes_where_there_is_one(monkeypatch):
    from autogemm.gpu import runtime

    monkeypatch.setattr(runtime, "cupy", lambda: _fake_cupy(12020, count=1))
    runtime.require_gpu()


needs_no_gpu = pytest.mark.skipif(gpu_available()[0], reason="this machine has a GPU")


@needs_no_gpu
@pytest.mark.parametrize("argv", [["tune", "--M", "64", "--storage", ":memory:"], ["bench", "--M", "64"],
                                  ["bench", "--M", "64", "--json"]])
def test_commands_without_a_driver_say_no_gpu(capsys, argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == 3
    assert NO_GPU in err and "insufficient" not in err and "Traceback" not in err
    if "--json" in argv:
        assert NO_GPU in json.loads(out)["error"]


@needs_no_gpu
def test_autogemm_tune_without_a_driver_raises_gpu_unavailable():
    with pytest.raises(autogemm.GpuUnavailable, match=NO_GPU):
        autogemm.tune(64, storage=":memory:")


def test_an_unavailable_gpu_raised_deep_in_a_command_exits_3(monkeypatch, capsys):
    from autogemm.gpu import runtime
    from autogemm.cli import tuning

    def lost():
        raise runtime.GpuUnavailable(f"{NO_GPU} (made up)")

    monkeypatch.setattr(tuning, "require_gpu", lambda: None)
    monkeypatch.setattr("autogemm.gpu.launch.current_device", lost)
    code, _, err = run_cli(capsys, "bench", "--M", "64")
    assert code == 3 and NO_GPU in err


# ---- check: the summary and exit status follow the table ----------------------------------------

CAPPED = SimtConfig(max_registers=96)
PLAIN = SimtConfig()


def _stub_compiler(monkeypatch, resources) -> None:
    """`check` compiles with a stand-in whose report is `resources(source, arch)`."""
    from autogemm.kernels import ptxas_report

    monkeypatch.setattr(ptxas_report, "report_compiler", lambda: ptxas_report.ReportCompiler("stand-in", resources))


@pytest.fixture
def stub_check(monkeypatch):
    """`check` over PLAIN and CAPPED with a compiler that reports spills for the capped kernel."""
    from autogemm.kernels.ptxas_report import ResourceUsage
    from autogemm.kernels.space import SearchSpace

    def resources(source, arch):
        spill = 64 if "_reg96" in source.kernel else 0
        return {source.kernel: ResourceUsage(source.kernel, 96, spill, spill, spill, 0)}

    _stub_compiler(monkeypatch, resources)
    monkeypatch.setattr(SearchSpace, "sample", lambda self, count, problem, device, seed=0: [PLAIN, CAPPED])


def test_check_reports_a_capped_spill_as_refused_and_exits_0_unless_strict(stub_check, capsys):
    """The README's own example (`check --arch sm_90 --count 12`) exited 1 where a sampled variant spilled
    under its max_registers: the loader refuses such a kernel, as a tune does, so it is reported as
    refused; --strict counts it as a failure."""
    code, out, err = run_cli(capsys, "check", "--count", "2")
    assert "refused when loaded" in out
    assert "1/2 variants compiled without spills (1 spill under max_registers and are refused when loaded" in err
    assert code == 0
    code, _, err = run_cli(capsys, "check", "--count", "2", "--strict")
    assert code == 1 and "--strict" in err


def test_check_fails_on_a_spill_without_a_register_cap(monkeypatch, capsys):
    from autogemm.kernels.ptxas_report import ResourceUsage
    from autogemm.kernels.space import SearchSpace

    _stub_compiler(monkeypatch, lambda source, arch: {source.kernel: ResourceUsage(source.kernel, 255, 32, 32, 32, 0)})
    monkeypatch.setattr(SearchSpace, "sample", lambda self, count, problem, device, seed=0: [PLAIN])
    code, _, err = run_cli(capsys, "check", "--count", "1")
    assert code == 1 and "0/1 variants compiled without spills (1 spill)" in err


def test_check_json_says_which_variants_are_refused(stub_check, capsys):
    code, out, _ = run_cli(capsys, "check", "--count", "2", "--json")
    report = json.loads(out)
    assert report["failures"] == 0 and report["refused"] == 1 and code == 0
    assert [v["spills"] for v in report["variants"]] == [False, True]
    assert [v["refused"] for v in report["variants"]] == [False, True]


def test_check_of_a_grouped_problem_takes_the_space_that_serves_it(monkeypatch, capsys):
    """`check --dtype bfloat16 --groups 8 ...` said no configuration of wmma_bf16.toml was valid for groups:
    the Hopper family alone computes grouped products, and its space is the one to check."""
    from autogemm.kernels.ptxas_report import ResourceUsage

    _stub_compiler(monkeypatch, lambda source, arch: {source.kernel: ResourceUsage(source.kernel, 168, 0, 0, 0, 0)})
    code, _, err = run_cli(capsys, "check", "--dtype", "bfloat16", "--groups", "8", "--m", "4096", "--n", "768",
                           "--k", "2048", "--count", "2")
    assert code == 0 and "variants of hopper.toml" in err, err


# ---- lower-case problem flags --------------------------------------------------------------------

@pytest.mark.parametrize("command", ["tune", "bench", "render", "check"])
def test_problem_flags_take_lower_case(command):
    extra = ["--config", "{}"] if command == "render" else []
    args = build_parser().parse_args([command, *extra, "--m", "100", "--n", "50", "--k", "30"])
    assert (args.m, args.n, args.k) == (100, 50, 30)
    args = build_parser().parse_args([command, *extra, "--M", "100", "--N", "50", "--K", "30"])
    assert (args.m, args.n, args.k) == (100, 50, 30)


# ---- errors list the valid choices ---------------------------------------------------------------

@pytest.mark.parametrize("argv", [["check", "--space", "nosuch"], ["tune", "--M", "64", "--space", "nosuch"]])
def test_an_unknown_space_names_the_shipped_ones(capsys, argv):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert "nosuch" in err and all(name in err for name in ("simt", "wmma_fp16", "hopper", "gemv"))


def test_a_space_file_that_is_broken_keeps_its_own_message(capsys, tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("family = [")
    code, _, err = run_cli(capsys, "check", "--space", str(path))
    assert code == 2 and "not valid TOML" in err and "shipped" not in err


@pytest.mark.parametrize("config,knobs", [
    ('{"colour": 1}', ("bm", "max_registers")),
    ('{"family": "hopper", "colour": 1}', ("bm", "stages")),
    ('{"family": "wmma", "colour": 1, "mma": true}', ("instruction",)),
])
def test_an_unknown_knob_names_the_family_knobs(capsys, config, knobs):
    code, _, err = run_cli(capsys, "render", "--config", config)
    assert code == 2 and "colour" in err
    assert all(knob in err for knob in knobs), err
    assert "mma," not in err  # a knob of an earlier version that upgrades is not reported unknown


def test_a_hopper_config_name_without_dtype_suggests_one(capsys):
    code, _, err = run_cli(capsys, "render", "--config", HopperConfig().name)
    assert code == 2
    assert "--dtype float16" in err and "bfloat16" in err
    code, out, _ = run_cli(capsys, "render", "--config", HopperConfig().name, "--dtype", "float16")
    assert code == 0 and "__global__" in out


# ---- the tune command a message suggests names the same problem ------------------------------------

@pytest.mark.parametrize("key", [
    "float32/fp32/nn/b1/100x50x30",
    "float16/fp32/nt/b3/64x128x256/bias_n+gelu+res",
    "float32/tf32/tn/b1/64x64x64",
    "bfloat16/fp32/nt/b1/16x4096x14336/bias_n+silu",
    "float8_e4m3fn/fp32/nt/b1/4096x4096x4096/scale_tensor>bfloat16",
    "float8_e5m2/fp32/nt/b1/128x4096x14336/scale_row+bias_n>float32",
    "float8_e4m3fn/fp32/nt/b1/256x512x1040/scale_block>float16",
])
def test_the_suggested_tune_command_names_the_same_problem(key):
    """`autogemm bench` on an untuned problem says which `autogemm tune` to run (`_problem_flags`): those
    flags, parsed back, are the same problem (dtype, compute mode, layout, batch, epilogue, FP8 scales)."""
    import shlex

    from autogemm.cli.arguments import problem_from_args
    from autogemm.cli.tuning import _problem_flags
    from autogemm.problem import Problem

    problem = Problem.from_key(key)
    args = build_parser().parse_args(["tune", *shlex.split(_problem_flags(problem))])
    assert problem_from_args(args) == problem
