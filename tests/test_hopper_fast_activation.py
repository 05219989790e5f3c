"""The Hopper family's `fast_activation` knob (templates/hopper_gemm.cu.j2, common.cuh.j2's epilogue_functions):
a GELU or SiLU epilogue computed in the store by the epilogue pass's forms (Abramowitz and Stegun's erf, the
hardware's exponential and quotient) instead of erff/expf and the IEEE quotient. What the config allows, that
the search space offers it only where it changes the kernel, that a config without it renders as before, and
that its kernels compile. CPU only; tests/test_gpu_epilogue.py runs them against float64."""

from __future__ import annotations

import dataclasses
import re

import pytest

from autogemm.epilogue import ACTIVATIONS, FAST_FORM_ACTIVATIONS, Epilogue
from autogemm.families import config_from_name
from autogemm.kernels.render import render
from autogemm.kernels.space import SearchSpace
from autogemm.problem import Problem
from test_hopper_stream_k import H200, compiles_without_spills

NAME = "hopper_128x192x64_w64x192_s4_g16_k1_o1_p_c2_ts_fa"
LAYER = Problem.from_layout(2048, 13824, 5120, "nt", dtype="float16", epilogue=Epilogue("n", "gelu"))
# the accurate forms' calls, and Abramowitz and Stegun's first coefficient (7.1.26's p = 0.3275911, over sqrt(2):
# the form takes |x| where 7.1.26 takes |x| / sqrt(2))
ACCURATE_CALLS = r"\b(erff|expf)\("
AS_P = "0.2316418882663604"


def _activation_body(code: str) -> str:
    """The body of the kernel's epilogue_activate, without its // comments (which name the functions the fast
    forms replace; the fast exponential's host branch, for the CPU tests' arithmetic, calls expf)."""
    body = code[code.index("epilogue_activate(Acc x) {"):]
    body = body[:body.index("\n}")]
    return "\n".join(line.split("//")[0] for line in body.splitlines())


def test_the_knob_names_round_trips_and_is_off_by_default():
    config = config_from_name(NAME)
    assert config.fast_activation and config.name == NAME
    plain = config_from_name(NAME.removesuffix("_fa"))
    assert not plain.fast_activation and dataclasses.replace(config, fast_activation=False) == plain


@pytest.mark.parametrize("activation", ["", *ACTIVATIONS])
def test_it_is_refused_where_it_would_change_nothing_and_renders_the_fast_forms_where_it_does(activation):
    problem = dataclasses.replace(LAYER, epilogue=Epilogue("n", activation))
    fast, plain = config_from_name(NAME), config_from_name(NAME.removesuffix("_fa"))
    reasons = fast.check(problem, H200)
    if activation not in FAST_FORM_ACTIVATIONS:
        assert any(r.startswith("choice") and "fast_activation" in r for r in reasons), reasons
        return
    assert reasons == []
    fast_code, plain_code = _activation_body(render(fast, problem).code), _activation_body(render(plain, problem).code)
    assert re.search(ACCURATE_CALLS, plain_code) and AS_P not in plain_code
    assert not re.search(ACCURATE_CALLS, fast_code)
    # (GELU's exponent has log2(e) folded in: 2^x; SiLU's is e^-x)
    assert ("epilogue_exp2(" if activation == "gelu" else "epilogue_exp(") in fast_code and "epilogue_divide(" in fast_code
    assert (AS_P in fast_code) == (activation == "gelu")


def test_the_space_offers_it_only_to_gelu_and_silu_epilogues():
    space = SearchSpace.load("hopper")
    for activation in ("", *ACTIVATIONS):
        problem = dataclasses.replace(LAYER, epilogue=Epilogue("n", activation))
        offered = space.knob_choices(problem, H200)["fast_activation"]
        assert offered == ((False, True) if activation in FAST_FORM_ACTIVATIONS else (False,)), (activation, offered)


@pytest.mark.parametrize("problem", [LAYER, Problem.from_layout(300, 1000, 256, "tn", dtype="bfloat16",
                                                                    epilogue=Epilogue("n", "silu", True))],
                         ids=["gelu-tma-store", "silu-residual-swapped"])
def test_fast_activation_kernels_compile_without_spills(problem):
    name = NAME if problem is LAYER else "hopper_128x128x64_w64x128_s5_g8_k1_o1_p_sw_fa"
    compiles_without_spills(name, problem)


def test_nvrtc_compiles_a_fast_activation_kernel(tmp_path, monkeypatch):
    """What serves compiles with NVRTC: __expf and __fdividef are device intrinsics it must know without a host
    compiler behind it."""
    from autogemm.kernels import compile as kernel_compile

    monkeypatch.setenv("AUTOGEMM_CUBIN_DIR", str(tmp_path))  # compiled here and now, none reused
    cubin = kernel_compile.compile_to_cubin(render(config_from_name(NAME), LAYER), "sm_90")
    assert cubin.read_bytes()[:4] == b"\x7fELF"


def test_a_new_studys_wave_seeds_take_the_fast_forms_where_they_are_offered():
    from autogemm.tuning.wave_seeds import wave_ranked

    space = SearchSpace.load("hopper")
    seeds = wave_ranked(space, LAYER, H200)
    assert seeds and all(config.fast_activation for config in seeds)
    bare = wave_ranked(space, dataclasses.replace(LAYER, epilogue=Epilogue("n")), H200)
    assert bare and not any(config.fast_activation for config in bare)


# (each layer's seeds had a spilling kernel: the ping-pong GELU tile with preload, 8 bytes before GELU's constants
# were folded, and 32 with a residual; check now refuses preload with consumers of 128 rows, an activation and a
# residual, whose 256 x 128 tiles in pairs spilled 76 bytes with the folded form)
SEEDED_LAYERS = [LAYER, Problem.from_layout(6144, 14336, 4096, "nt", dtype="bfloat16", epilogue=Epilogue("n", "gelu", True))]


@pytest.mark.parametrize("problem", SEEDED_LAYERS, ids=[p.epilogue.key for p in SEEDED_LAYERS])
def test_a_gelu_layers_wave_seeds_compile_without_spills(problem):
    """What a new study of such a layer measures first."""
    from autogemm.tuning.wave_seeds import wave_ranked

    seeds = wave_ranked(SearchSpace.load("hopper"), problem, H200)
    assert seeds
    for config in seeds:
        compiles_without_spills(config.name, problem)
