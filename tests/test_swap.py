"""The operand swap (C^T = B^T A^T) on the CPU side: the swapped problem in every layout, what a
swapping GEMV config checks, renders and loads, which spaces a short N searches. Its results are
checked on the GPU (test_gpu_kernels: swapping GEMV configs on every edge shape and layout)."""

from __future__ import annotations

import dataclasses

import pytest

from autogemm.families import config_from_name
from autogemm.families.base import VectorWidths
from autogemm.gpu.operands import KernelOperand
from autogemm.problem import LAYOUTS, Device, Problem
from autogemm.kernels.render import render
from autogemm.kernels.space import SearchSpace, candidate_space_names

SM90 = dataclasses.replace(Device.for_arch("sm_90"), sm_count=132)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_swapped_problem_reads_the_same_memory(layout):
    """C^T = B^T A^T: B (stored K x N, or N x K) is the first operand, read transposed relative to
    how it served as B; the layouts map NN <-> TT, NT -> NT, TN -> TN."""
    problem = Problem.from_layout(5, 7, 11, layout, batch=2, dtype="float16")
    swapped = problem.swapped()
    assert (swapped.m, swapped.n, swapped.k, swapped.batch, swapped.dtype) == (7, 5, 11, 2, "float16")
    assert swapped.layout == {"nn": "tt", "nt": "nt", "tn": "tn", "tt": "nn"}[layout]
    assert swapped.swapped() == problem
    assert swapped.flops == problem.flops


def test_a_swapping_gemv_config_is_checked_rendered_and_loaded_as_the_swapped_product():
    config = config_from_name("gemv_m4_n32_k64_w4_v4_u4_s1_o1_sw")
    assert config.swaps_operands and config.kernel_problem(Problem(300, 7, 200)) == Problem(7, 300, 200, trans_a=True,
                                                                                            trans_b=True)
    source = render(config, Problem(300, 7, 200))
    assert "_tt_" in source.kernel and "constexpr bool C_TRANSPOSED = true;" in source.code
    plain = render(config.replace(swap=False), Problem(300, 7, 200))
    assert "_nn_" in plain.kernel and "constexpr bool C_TRANSPOSED = false;" in plain.code
    assert not config.check(Problem(300, 7, 200), SM90)
    # the kernel's A is the user's B: its width follows B's alignment (here: N = 7, scalar)
    a = KernelOperand(transposed=False, ld=200, batch_stride=0, pointer=1 << 20)
    b = KernelOperand(transposed=False, ld=7, batch_stride=0, pointer=1 << 20)
    c = KernelOperand(transposed=False, ld=7, batch_stride=0, pointer=1 << 20)
    assert config.vector_widths(a, b, c, 4) == VectorWidths(1, 4, 1)
    assert config.replace(swap=False).vector_widths(a, b, c, 4) == VectorWidths(1, 1, 1)


def test_a_short_n_searches_the_gemv_space_with_the_swap_offered():
    short_n, short_m = Problem(4096, 16, 4096), Problem(16, 4096, 4096)
    assert candidate_space_names(short_n)[0] == "gemv" and candidate_space_names(short_m)[0] == "gemv"
    assert candidate_space_names(Problem(4096, 17, 4096)) == ("simt",)
    space = SearchSpace.load("gemv")
    assert space.knob_choices(short_n, SM90)["swap"] == (False, True)
    assert space.knob_choices(short_m, SM90)["swap"] == (False,)
    swapping = config_from_name("gemv_m16_n32_k512_w8_v4_u1_s8_o1_sw")
    assert space.suits(swapping, short_n, SM90) and not swapping.check(short_n, SM90)
    # bm rows against the kernel's M (the user's N): 16 rows for N = 1 are refused
    assert not space.suits(swapping, Problem(4096, 1, 4096), SM90)
