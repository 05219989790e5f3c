"""Kernel selection as a pure function over cache records (no GPU): the exact record first (a
generated kernel or cuBLAS), then a tuned config the model predicts to beat cuBLAS by the margin,
then cuBLAS (the built-in defaults only where cupy.matmul cannot serve the dtype)."""

from __future__ import annotations

import dataclasses

import pytest

from autogemm.results.cache import Record
from autogemm.families import SimtConfig
from autogemm.problem import Device, Problem
from autogemm.kernels.render import kernel_template_hash
from autogemm.serving import select
from autogemm.measure.timing import PROTOCOL
from autogemm.serving.select import Choice, ChoiceSource, choose, default_config
from autogemm.results.cache import cublas_record

SM90 = Device.for_arch("sm_90")
# what the model needs: SMs and the memory's bandwidth
H100 = dataclasses.replace(SM90, name="NVIDIA H100 80GB HBM3", sm_count=132, memory_bandwidth=3.35e12)


def _record(problem: Problem, config: SimtConfig, ratio=1.0, date="2026-11-22", tflops=40.0, protocol=PROTOCOL) -> Record:
    """A record of the current timing protocol: the kernel at `tflops`, cuBLAS `ratio` times slower."""
    time_ms = problem.flops / tflops / 1e9
    return Record(problem=problem.key, family="simt", config={k: v for k, v in config.to_dict().items() if k != "family"},
                  config_name=config.name, time_ms=time_ms, tflops=tflops, cublas_ms=time_ms * ratio,
                  cublas_tflops=tflops / ratio, ratio=ratio, rel_error=1e-7,
                  template_hash=kernel_template_hash(config.template), device="x", date=date, protocol=protocol)


TUNED = SimtConfig(64, 128, 16, 32, 64, 8, 8, 4, 4, 3, "swizzle", 8, 1, 1)
OTHER = SimtConfig(128, 128, 8, 32, 64, 8, 8, 4, 4, 2, "pad", 8, 1, 1)


def test_choose_exact_entry_first():
    problem = Problem(4096, 4096, 4096)
    exact = (_record(problem, TUNED), "user")
    choice = choose(problem, SM90, exact, [_record(Problem(4000, 4000, 4000), OTHER)])
    assert (choice.source, choice.config) == ("cache", TUNED)
    shipped = choose(problem, SM90, (_record(problem, TUNED), "shipped"), [])
    assert shipped.source == "shipped cache"


def test_a_record_compiled_by_another_nvrtc_release_is_guarded(monkeypatch):
    """Its source renders the same, but ptxas's registers differ between NVRTC releases: of the kernels shipped
    records serve, 7 that compiled without spills under NVRTC 13.0 (their tunes') spill 12-32 bytes under 13.5
    (what a new install brings). Such a record's kernel is checked against cuBLAS on its first calls, as one of an
    older timing protocol is; the same release, or one not known, serves it as measured."""
    from autogemm.results import provenance, record as record_module

    problem = Problem(4096, 4096, 4096)
    for module in (provenance, record_module, select):
        monkeypatch.setattr(module, "nvrtc_release", lambda: "13.5")
    measured = dataclasses.replace(_record(problem, TUNED, ratio=1.08), versions={"autogemm": "0.2.0", "nvrtc": "13.0"})
    assert measured.compiled_by_another_nvrtc == "13.0"
    choice = choose(problem, SM90, (measured, "shipped"), [])
    assert (choice.source, choice.config, choice.guarded) == ("shipped cache", TUNED, True)
    assert "compiled by NVRTC 13.0 then and by 13.5 here: guarded" in choice.reason
    for versions in ({"nvrtc": "13.5"}, {}, {"nvrtc": ""}):
        alike = dataclasses.replace(measured, versions=versions)
        assert not alike.compiled_by_another_nvrtc and not choose(problem, SM90, (alike, "user"), []).guarded
    for module in (provenance, record_module, select):  # (NVRTC cannot be loaded here: nothing to compare)
        monkeypatch.setattr(module, "nvrtc_release", lambda: "")
    assert not measured.compiled_by_another_nvrtc and not choose(problem, SM90, (measured, "user"), []).guarded
    kept = cublas_record(measured)  # (a cuBLAS record serves cuBLAS, whatever compiled its best kernel)
    assert choose(problem, SM90, (kept, "user"), []).config is None


def test_the_records_say_which_nvrtc_compiled_their_kernels(monkeypatch):
    """(not CuPy's own NVRTC, which compiles none of them)"""
    from autogemm.kernels import nvrtc
    from autogemm.results import provenance

    monkeypatch.setattr(nvrtc, "version", lambda: (13, 5))
    assert provenance.runtime_versions()["nvrtc"] == "13.5"

    def missing():
        raise nvrtc.NvrtcError("NVRTC (libnvrtc) cannot be found or loaded")

    monkeypatch.setattr(nvrtc, "version", missing)
    assert "nvrtc" not in provenance.runtime_versions()


def test_a_cublas_record_serves_cublas():
    problem = Problem(4096, 4096, 4096)
    kept = cublas_record(_record(problem, TUNED, ratio=0.93))
    choice = choose(problem, SM90, (kept, "user"), [kept])
    assert (choice.source, choice.config) == ("cache", None)
    assert "cuBLAS kept; best generated kernel 0.930x" in choice.reason


def test_a_config_predicted_to_win_by_the_margin_is_chosen():
    """Near the tuned shape, with the same fill of the GPU, the measured win carries over."""
    records = [_record(Problem(4096, 4096, 4096), TUNED, ratio=1.10), _record(Problem(512, 512, 512), OTHER, ratio=1.2)]
    choice = choose(Problem(4096, 4224, 4096), H100, None, records)
    assert (choice.source, choice.config) == ("predicted", TUNED)
    assert "from its 1.100x on float32/fp32/nn/b1/4096x4096x4096" in choice.reason
    assert [c["config"] for c in choice.details["candidates"]][0] == TUNED.name


def test_shapes_that_leave_the_gpu_idle_go_to_cublas():
    """The issue's cases: a 128-wide tile on M = 127 or N = 64 leaves most SMs idle; the nearest
    shape's config ran at 0.13x there. The model predicts the loss (from a record near enough to
    count as evidence) and keeps cuBLAS."""
    for tuned, problem in ((Problem(512, 4096, 4096), Problem(127, 4096, 4096)),
                           (Problem(8192, 256, 8192), Problem(8192, 64, 8192))):
        choice = choose(problem, H100, None, [_record(tuned, OTHER, ratio=1.05)])
        assert choice.source == "cublas" and choice.config is None, choice.reason
        (candidate,) = choice.details["candidates"]
        assert candidate["predicted_ratio"] < 0.7 and not candidate["wins"]


def test_the_model_clamps_split_k_to_the_k_tiles():
    split = TUNED.replace(split_k=8)
    choice = choose(Problem(64, 64, 32), H100, None, [_record(Problem(64, 64, 1024), split, ratio=3.0)])
    assert choice.details["candidates"][0]["config"] == split.replace(split_k=2).name


def test_with_nothing_tuned_cublas_serves_every_dtype():
    for problem in (Problem(100, 100, 100), Problem(64, 64, 64, dtype="float16"), Problem(64, 64, 64, compute="tf32"),
                    Problem(64, 64, 64, dtype="float64"), Problem(64, 64, 64, dtype="bfloat16")):
        choice = choose(problem, SM90, None, [])
        assert choice.source == "cublas" and choice.config is None and "nothing tuned" in choice.reason


def test_a_dtype_cublas_is_not_asked_to_serve_gets_the_default(monkeypatch):
    monkeypatch.setattr(select, "CUBLAS_SERVES", set())
    choice = choose(Problem(64, 64, 64, dtype="bfloat16"), SM90, None, [])
    assert choice.source == "default" and choice.config.family == "wmma"
    # no tensor-core path for bfloat16 before sm_80: cupy.matmul
    assert choose(Problem(64, 64, 64, dtype="bfloat16"), Device.for_arch("sm_75"), None, []).source == "cublas"
    long_k = default_config(Problem(32, 32, 65536), SM90)
    assert long_k.split_k > 1


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 700, 3), (4096, 4096, 4096), (127, 129, 65), (7, 3, 100000)])
def test_a_default_exists_for_every_shape(m, n, k):
    assert default_config(Problem(m, n, k), SM90) is not None
    for dtype, compute in (("float16", "fp32"), ("bfloat16", "fp32"), ("float32", "tf32"), ("float64", "fp64")):
        assert default_config(Problem(m, n, k, dtype=dtype, compute=compute), SM90) is not None


def test_choice_sources_are_an_enum_of_the_strings_explain_shows():
    """The sources are ChoiceSource members, equal to (and formatted as) the strings explain, the
    benchmarks' tables and the tests have always shown; a string that names no source is refused."""
    assert {source.value for source in ChoiceSource} == {
        "cache", "shipped cache", "autotune", "predicted", "guard", "race", "default", "cublas", "cupy.matmul"}
    problem = Problem(4096, 4096, 4096)
    shipped = choose(problem, SM90, (_record(problem, TUNED), "shipped"), [])
    assert shipped.source is ChoiceSource.SHIPPED_CACHE and shipped.source == "shipped cache"
    assert f"{shipped.source}" == str(shipped.source) == "shipped cache"
    assert choose(problem, SM90, None, []).source is ChoiceSource.CUBLAS
    assert Choice("predicted", TUNED, "given as a string").source is ChoiceSource.PREDICTED
    with pytest.raises(ValueError, match="'cached' is not a valid ChoiceSource"):
        Choice("cached", None, "a misspelt source")
