"""Operand repacking (CPU side): which operands are copied, into what pitch, for every layout;
and what a repacking config renders and compiles for. The copies' results are checked on the GPU
(test_gpu_kernels: a repacking config on every edge shape and layout, misaligned views included)."""

from __future__ import annotations

import pytest

from autogemm.families import config_from_name
from autogemm.families.base import VectorWidths
from autogemm.gpu.operands import KernelOperand
from autogemm.problem import LAYOUTS, Device, Problem
from autogemm.kernels.render import render
from autogemm.gpu.repack import plan_repacking, repacked, stored_extent

REPACKING = "128x256x16_w32x128_t8x16_v44_s3_plain_g1_k1_o1_r_sk_pk"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_stored_extent_follows_the_layout(layout):
    problem = Problem.from_layout(5, 7, 11, layout)
    a = (11, 5) if layout[0] == "t" else (5, 11)  # A is M x K, stored K x M when transposed
    b = (7, 11) if layout[1] == "t" else (11, 7)  # B is K x N, stored N x K when transposed
    assert stored_extent(problem, "A") == a and stored_extent(problem, "B") == b


def test_only_what_the_vector_width_cannot_load_is_copied():
    problem = Problem(4095, 4097, 1023, batch=3)
    dense_a = KernelOperand(transposed=False, ld=1023, batch_stride=4095 * 1023, pointer=1 << 20)
    plan = plan_repacking(problem, "A", dense_a, vec=4, itemsize=4)
    assert (plan.rows, plan.length, plan.matrices, plan.pitch) == (4095, 1023, 3, 1024)
    assert plan.stride == 4095 * 1024 and plan.nbytes == 3 * 4095 * 1024 * 4
    kernel_a = repacked(dense_a, plan)
    assert (kernel_a.ld, kernel_a.batch_stride, kernel_a.transposed) == (1024, 4095 * 1024, False)
    assert kernel_a.vector_width(4, 4) == 4
    # B shared by the batch (stride 0): one matrix is copied, and the copy is shared as well
    shared_b = KernelOperand(transposed=False, ld=4097, batch_stride=0, pointer=1 << 20)
    plan_b = plan_repacking(problem, "B", shared_b, vec=4, itemsize=4)
    assert (plan_b.rows, plan_b.length, plan_b.matrices, plan_b.pitch, plan_b.stride) == (1023, 4097, 1, 4100, 0)
    # aligned: nothing to copy, the operand is used as it is
    aligned = KernelOperand(transposed=False, ld=1024, batch_stride=0, pointer=1 << 20)
    assert plan_repacking(Problem(8, 8, 1024), "A", aligned, vec=4, itemsize=4) is None
    assert repacked(aligned, None) is aligned
    # an aligned pitch at a misaligned address (a view one element in) is copied too
    shifted = KernelOperand(transposed=False, ld=1024, batch_stride=0, pointer=(1 << 20) + 4)
    assert plan_repacking(Problem(8, 8, 1024), "A", shifted, vec=4, itemsize=4).pitch == 1024
    # a transposed A (stored K x M): rows of M elements; pitches stay 16-byte multiples for 2-byte types
    transposed = KernelOperand(transposed=True, ld=4095, batch_stride=0, pointer=1 << 20)
    plan_t = plan_repacking(Problem(4095, 8, 1023, trans_a=True), "A", transposed, vec=2, itemsize=2)
    assert (plan_t.rows, plan_t.length, plan_t.pitch) == (1023, 4095, 4096)


def test_a_repacking_config_is_compiled_for_full_vector_widths_and_brings_its_copy_kernel():
    config = config_from_name(REPACKING)
    problem = Problem(4095, 4097, 1023)
    assert config.repacks_operands and config.packed_widths(problem) == VectorWidths(4, 4, 1)
    odd = KernelOperand(transposed=False, ld=1023, batch_stride=0, pointer=(1 << 20) + 4)
    assert config.vector_widths(odd, odd, odd, 4) == VectorWidths(4, 4, 1)
    source = render(config, problem)
    assert source.repack_kernel == source.kernel + "_repack" and f"{source.repack_kernel}(" in source.code
    plain = config.replace(repack=False)
    assert not plain.repacks_operands and plain.packed_widths(problem) == VectorWidths(1, 1, 1)
    assert render(plain, problem).repack_kernel is None and "_repack(" not in render(plain, problem).code
    # its registers are estimated for the full-width loads it will run: it fits where the same
    # tiles loading element by element do not
    device = Device.for_arch("sm_90")
    assert not config.check(problem, device)
    assert any(r.startswith("registers") for r in plain.check(problem, device))


def test_repacking_with_scalar_loads_is_refused():
    config = config_from_name("16x32x8_w16x16_t2x4_v12_s2_plain_g1_k1_o4").replace(repack=True)
    assert config.name.endswith("_pk")
    assert "choice: repack copies operands to vector-aligned pitches; with vec=1 it would copy for nothing" in \
        config.check(Problem(127, 129, 65), Device.for_arch("sm_90"))
