"""The Hopper family's `stmatrix` knob (templates/hopper_gemm.cu.j2): the TMA store's chunks written four
8 x 8 matrices an instruction (transposed where the roles are swapped) instead of a value or a pair at a
time. What the config allows, that every other config renders without it, and that its kernels compile
without spills. CPU only; tests/test_gpu_kernels.py and tests/test_gpu_epilogue.py run them against
float64."""

from __future__ import annotations

import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.kernels.render import render
from autogemm.problem import Problem
from test_hopper_stream_k import H200, compiles_without_spills

GELU = Epilogue("n", "gelu", True)
VARIANTS = [
    ("hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts_stm", Problem.from_layout(8192, 8192, 8192, "nt", dtype="bfloat16")),
    ("hopper_128x128x64_w64x128_s5_g8_k1_o1_p_ts_sw_stm", Problem.from_layout(1000, 3001, 520, "nn", dtype="float16", epilogue=GELU)),
    ("hopper_128x128x64_w64x128_s5_g8_k1_o1_p_ts_stm", Problem.from_layout(1000, 3001, 520, "tt", dtype="float16", epilogue=GELU)),
]


def test_a_stmatrix_config_names_renders_and_refuses_what_it_does_not_go_with():
    name, problem = VARIANTS[0]
    config = config_from_name(name)
    assert config.stmatrix and config.name == name and config.check(problem, H200) == []
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" in render(config, problem).code
    plain = config_from_name(name.removesuffix("_stm"))
    assert not plain.stmatrix and "stmatrix" not in render(plain, problem).code
    # it writes the TMA store's chunks, of 16-bit values
    reasons = config_from_name("hopper_128x256x64_w64x256_s4_g8_k1_o1_p_stm").check(problem, H200)
    assert any("needs tma_store" in r for r in reasons), reasons
    tf32 = Problem.from_layout(512, 512, 512, "nt", dtype="float32", compute="tf32")
    reasons = config_from_name("hopper_128x128x32_w64x128_s4_g8_k1_o1_p_ts_stm").check(tf32, H200)
    assert any(r.startswith("dtype") and "16-bit" in r for r in reasons), reasons


@pytest.mark.parametrize("name, problem", VARIANTS, ids=[n for n, _ in VARIANTS])
def test_stmatrix_kernels_compile_without_spills(name, problem):
    compiles_without_spills(name, problem)


def test_nvrtc_compiles_a_stmatrix_kernel(tmp_path, monkeypatch):
    """What serves compiles with NVRTC, not nvcc: NVRTC has no host compiler behind it, so a builtin that
    nvcc's host side lends (__builtin_memcpy) is not there. The epilogue variant, by the installed NVRTC."""
    from autogemm.kernels import compile as kernel_compile

    monkeypatch.setenv("AUTOGEMM_CUBIN_DIR", str(tmp_path))  # compiled here and now, none reused
    name, problem = VARIANTS[1]
    cubin = kernel_compile.compile_to_cubin(render(config_from_name(name), problem), "sm_90")
    assert cubin.read_bytes()[:4] == b"\x7fELF"
