"""The epilogue's CUDA code without a GPU: the unfused epilogue kernel renders and compiles (NVRTC, as it is
served) for every product dtype, output dtype and epilogue part; the macros' arithmetic (bias, activation,
residual, conversion to D's type), compiled for the host with nvcc, stays within `error_bound` of the
float64 reference; and a bare kernel's source does not change because the macros exist.

CI has nvcc (and the host compiler it drives); without them these tests fail and say so.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from autogemm import dtypes
from autogemm.epilogue import ACTIVATIONS, OUTPUT_DTYPES, Epilogue, error_bound, reference
from autogemm.problem import Device
from autogemm.kernels.ptxas_report import find_nvcc, nvrtc_resources
from autogemm.kernels.render import environment, render_epilogue

# every product dtype with every output dtype it is written as (each with one of the epilogues, in turn),
# and every epilogue on FP16 products
OUTPUTS = [("float16", ""), ("float16", "float32"), ("bfloat16", ""), ("bfloat16", "float32"), ("float32", ""),
           ("float32", "bfloat16"), ("float32", "float16"), ("float64", ""), ("float64", "float32")]
PARTS = [("n", "gelu", True), ("m", "silu", False), ("", "gelu_tanh", True), ("n", "relu", False), ("", "", True)]
COMPILED = list(dict.fromkeys([(dtype, Epilogue(*PARTS[i % len(PARTS)], out)) for i, (dtype, out) in enumerate(OUTPUTS)]
                              + [("float16", Epilogue(*parts)) for parts in PARTS]
                              + [("bfloat16", Epilogue("n", "silu", True, gated=True)),
                                 ("float32", Epilogue("", "gelu", False, "bfloat16", gated=True))]))


def _widest_vector(dtype: str, epilogue: Epilogue) -> int:
    return 16 // max(dtypes.lookup(dtype).itemsize, dtypes.lookup(epilogue.output_dtype(dtype)).itemsize)


def test_the_unfused_epilogue_kernel_compiles_for_every_dtype_and_part():
    # each case element-wise and with its widest packs (16 bytes): the packs stay in registers
    sources = [render_epilogue(dtype, epilogue, vector) for dtype, epilogue in COMPILED
               for vector in (1, _widest_vector(dtype, epilogue))]
    assert len({s.kernel for s in sources}) == len(sources)  # one name per (dtype, epilogue, vector)
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        reports = list(pool.map(lambda s: nvrtc_resources(s, "sm_90"), sources))
    for source, report in zip(sources, reports):
        usage = report[source.kernel]
        assert usage.spill_store_bytes == 0 and usage.stack_bytes == 0, (source.kernel, usage)
        # the epilogue's operands come last, before only a Hopper split-K's workspace
        parameters = source.parameters(source.kernel)
        if parameters[-2:] == ("partials", "counters"):
            parameters = parameters[:-2]
        assert parameters[-4:] == ("bias", "residual", "ldr", "stride_r")


def test_the_unfused_kernel_is_refused_for_packs_wider_than_16_bytes():
    with pytest.raises(ValueError, match="takes 1 to 4 columns a thread"):
        render_epilogue("float32", Epilogue(activation="relu"), 8)
    with pytest.raises(ValueError, match="takes 1 to 4 columns a thread"):  # (FP16 products written as FP32)
        render_epilogue("float16", Epilogue(activation="relu", out_dtype="float32"), 8)
    with pytest.raises(ValueError, match="not 3"):
        render_epilogue("float16", Epilogue(activation="relu"), 3)
    assert render_epilogue("float16", Epilogue(activation="relu"), 8).kernel.endswith("_relu_v8")


def test_the_pass_takes_the_widest_packs_every_pitch_and_pointer_allows():
    from autogemm.gpu.epilogue_pass import vector_width

    gelu = Epilogue("n", "gelu")
    aligned = [(4096, 2), (8192, 2)]
    assert vector_width("bfloat16", gelu, 14336, (14336, 14336 * 16), aligned) == 8
    assert vector_width("float32", gelu, 14336, (14336,), [(4096, 4)]) == 4
    assert vector_width("float64", gelu, 14336, (14336,), [(4096, 8)]) == 2
    assert vector_width("float32", Epilogue("n", "gelu", out_dtype="bfloat16"), 64, (64,), [(4096, 4), (4096, 2)]) == 4
    assert vector_width("bfloat16", gelu, 14340, (14340,), aligned) == 4  # N a multiple of 4, not 8
    assert vector_width("bfloat16", gelu, 14336, (14337,), aligned) == 1  # an odd pitch
    assert vector_width("bfloat16", gelu, 14336, (14336,), aligned + [(4098, 2)]) == 1  # a bias one element in
    assert vector_width("bfloat16", gelu, 14336, (14336,), aligned + [(4100, 2)]) == 2
    assert vector_width("bfloat16", gelu, 1, (1,), aligned) == 1


def test_the_unfused_kernel_is_refused_for_nothing_to_do_and_for_outputs_it_does_not_write():
    with pytest.raises(ValueError, match="identity epilogue has no kernel"):
        render_epilogue("float32", Epilogue())
    with pytest.raises(ValueError, match="out_dtype float16 is not written for float64 products"):
        render_epilogue("float64", Epilogue(activation="relu", out_dtype="float16"))
    assert Epilogue(out_dtype="bfloat16").output_dtype("float32") == "bfloat16"
    assert Epilogue(activation="gelu").output_dtype("float16") == "float16"


def test_a_bare_kernels_source_has_no_epilogue_code():
    # the macros emit nothing for the identity epilogue: the bare kernels' sources, and with them the
    # shipped records' source digests, stay as they were
    from autogemm.families import config_from_name
    from autogemm.kernels.render import render
    from autogemm.problem import Problem

    code = render(config_from_name("64x64x16_w32x32_t4x8_v44_s3_pad_g8_k1_o2"), Problem(64, 64, 64)).code
    assert "epilogue_value" not in code and "EpilogueArgs" not in code
    identity = environment().from_string('{% import "common.cuh.j2" as common %}{{ common.epilogue_functions(e) }}'
                                         '{{ common.epilogue_parameters(e) }}{{ common.epilogue_arguments(e) }}')
    assert identity.render(e=Epilogue().template_context("float32")).strip() == ""


# ---- the macros' arithmetic, on the host ----------------------------------------------------------------

# pre-activation values (alpha * acc) spread over where the activations bend and saturate, exact in FP32
Y = np.array([0.0, 1e-3, -1e-3, 0.125, -0.375, 0.7, -0.7, 1.5, -1.5, 2.4, -2.4, 3.9, -3.9, 6.0, -6.0, 11.0, -11.0,
              30.0, -30.0, 100.0, -100.0], dtype=np.float32).astype(np.float64)
BIAS = np.linspace(-1.25, 1.75, Y.size)
RESIDUAL = np.linspace(2.5, -3.0, Y.size)

# the gated cases' up halves and their biases (the gate's are Y and BIAS)
UP = np.linspace(3.0, -2.5, Y.size).astype(np.float32).astype(np.float64)
UP_BIAS = np.linspace(0.5, -0.75, Y.size)

# every case in one program (a namespace each), compiled once: an nvcc build of a host program takes
# seconds, and one a case made these tests a tenth of the CPU suite's time
HOST_PROGRAM = """{% import "common.cuh.j2" as common %}
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{% for case in cases %}
namespace case{{ loop.index0 }} {
typedef {{ case.accumulator }} Acc;
{{ common.epilogue_functions(case.e, fast=case.fast) }}
void run() {
    const double y[] = { {{ y }} }, u[] = { {{ u }} }, bias[] = { {{ bias }} }, residual[] = { {{ residual }} };
    EpOut b[{{ 2 * count }}], r[{{ count }}];
    for (int i = 0; i < {{ 2 * count }}; ++i) b[i] = epilogue_from_acc(Acc(bias[i]));
    for (int i = 0; i < {{ count }}; ++i) r[i] = epilogue_from_acc(Acc(residual[i]));
    const EpilogueArgs ep{b, r, 0, 0};
    for (int i = 0; i < {{ count }}; ++i) {
{% if case.e.gated %}
        // the gate y[i] with bias[i], the up half u[i] with bias[i + count]
        const EpOut d = epilogue_from_acc(epilogue_gated_value(Acc(y[i]), Acc(u[i]), ep, i, i + {{ count }}, i));
{% else %}
        // bias "n" reads column i, "m" row i; the residual element i
        const EpOut d = epilogue_from_acc(epilogue_value(Acc(y[i]), ep, i, i, i));
{% endif %}
        std::printf("{{ loop.index0 }} %.17g %.17g %.17g %.17g\\n", double(epilogue_to_acc(d)),
                    double(epilogue_to_acc(b[i])), double(epilogue_to_acc(b[i + {{ count }}])),
                    double(epilogue_to_acc(r[i])));
    }
}
}
{% endfor %}
int main() {
{% for case in cases %}
    case{{ loop.index0 }}::run();
{% endfor %}
    return 0;
}
"""

# each activation once at least, each accumulator type and each rounding of D (subnormal FP16 included)
HOST_CASES = [("float32", Epilogue("n", "gelu", True)), ("float32", Epilogue("m", "gelu_tanh", False, "bfloat16")),
              ("bfloat16", Epilogue("n", "silu", True, "float32")), ("float16", Epilogue("n", "relu", True)),
              ("float16", Epilogue("", "silu", False)), ("float64", Epilogue("n", "gelu", True)),
              ("float64", Epilogue("m", "silu", True, "float32")), ("bfloat16", Epilogue("", "gelu_tanh", True))]
assert {e.activation for _, e in HOST_CASES} == set(ACTIVATIONS)
WRONG_GELU = ("float32", Epilogue("n", "gelu_tanh", True))  # (computed where the erf form is asked for)
# the pass's forms of silu and GELU (epilogue_functions(fast=True)), on the host with the accurate exp and quotient
# (the hardware's are the GPU tests'): every accumulator type, a residual, an FP16 D with subnormals
FAST_CASES = [("float16", Epilogue("n", "silu", True)), ("float32", Epilogue("", "silu", False, "bfloat16")),
              ("bfloat16", Epilogue("n", "silu", False)), ("float64", Epilogue("n", "silu", True)),
              ("float16", Epilogue("n", "gelu", True)), ("float32", Epilogue("", "gelu", False)),
              ("bfloat16", Epilogue("n", "gelu", False, "float32")), ("float64", Epilogue("n", "gelu", False))]
GATED_CASES = [("bfloat16", Epilogue("n", "silu", True, "float32", gated=True)),
               ("float32", Epilogue("n", "gelu", False, gated=True))]


@pytest.fixture(scope="module")
def on_host(tmp_path_factory) -> dict:
    """(dtype, epilogue) -> the host program's rows for it: D, the gate's bias, the up half's bias and
    the residual, each as the kernel holds them (rounded to D's type)."""
    cases = [(dtype, epilogue, False) for dtype, epilogue in HOST_CASES + [WRONG_GELU] + GATED_CASES] \
        + [(dtype, epilogue, True) for dtype, epilogue in FAST_CASES]
    code = environment().from_string(HOST_PROGRAM).render(
        cases=[{"accumulator": dtypes.lookup(dtype).accumulator, "e": epilogue.template_context(dtype), "fast": fast}
               for dtype, epilogue, fast in cases], count=Y.size, y=", ".join(repr(float(v)) for v in Y),
        u=", ".join(repr(float(v)) for v in UP), bias=", ".join(repr(float(v)) for v in np.concatenate([BIAS, UP_BIAS])),
        residual=", ".join(repr(float(v)) for v in RESIDUAL))
    folder = tmp_path_factory.mktemp("epilogue-host")
    cu, program = folder / "epilogue.cu", folder / "epilogue"
    cu.write_text(code)
    built = subprocess.run([find_nvcc(), "-std=c++17", "-o", str(program), str(cu)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    ran = subprocess.run([str(program)], capture_output=True, text=True, check=True)
    rows = np.array([[float(v) for v in line.split()] for line in ran.stdout.splitlines()])
    return {(case[:2] if not case[2] else ("fast", *case[:2])): rows[rows[:, 0] == index, 1:] for index, case in enumerate(cases)}


@pytest.mark.parametrize("fast,dtype,epilogue", [(False, *case) for case in HOST_CASES] + [(True, *case) for case in FAST_CASES],
                         ids=[f"{d}-{e}" for d, e in HOST_CASES] + [f"pass-{d}-{e}" for d, e in FAST_CASES])
def test_the_epilogue_arithmetic_stays_within_its_bound_of_the_float64_reference(fast, dtype, epilogue, on_host):
    out = dtypes.lookup(epilogue.output_dtype(dtype))
    acc_roundoff = dtypes.lookup(dtype).accumulator_roundoff
    d, bias, _, residual = on_host[("fast", dtype, epilogue) if fast else (dtype, epilogue)].T
    assert d.size == Y.size
    # bias and residual as the kernel holds them: rounded to D's type
    assert np.all(np.abs(bias - BIAS) <= out.element_roundoff * np.abs(BIAS) + out.smallest_normal)
    shape = (-1, 1) if epilogue.bias == "m" else (1, -1)  # (one row of outputs, or one column for a bias along M)
    expected = reference(Y.reshape(shape), epilogue, bias=bias if epilogue.bias else None,
                         residual=residual.reshape(shape) if epilogue.residual else None).ravel()
    pre = Y + (bias if epilogue.bias else 0.0)
    bound = error_bound(acc_roundoff * np.abs(pre), epilogue, np.abs(expected), out.element_roundoff,
                        np.abs(residual) + np.abs(expected), pre_activation_magnitude=np.abs(pre),
                        accumulator_unit_roundoff=acc_roundoff, out_smallest_normal=out.smallest_normal)
    error = np.abs(d - expected)
    worst = int(np.argmax(error / np.maximum(bound, math.ulp(0.0))))
    assert np.all(error <= bound), (f"y={Y[worst]}: D={d[worst]!r}, reference {expected[worst]!r}, "
                                    f"error {error[worst]:.3g} > bound {bound[worst]:.3g}")


def test_only_the_pass_takes_the_hardware_exponential_and_quotient_and_only_for_silu_and_gelu(tmp_path, monkeypatch):
    # the tile families' stores keep the accurate forms (the shipped records' sources hold them byte for
    # byte); FP64 accumulators and the other activations keep them in the pass too
    from autogemm.families import config_from_name
    from autogemm.kernels import compile as kernel_compile
    from autogemm.kernels.render import render
    from autogemm.problem import Problem

    monkeypatch.setenv("AUTOGEMM_CUBIN_DIR", str(tmp_path))  # (the installed NVRTC takes it, as nvcc does)
    for activation, accurate in (("silu", "expf(-x)"), ("gelu", "erff(")):
        in_pass = render_epilogue("bfloat16", Epilogue("n", activation), 8)
        assert "__fdividef" in in_pass.code and accurate not in in_pass.code
        assert kernel_compile.compile_to_cubin(in_pass, "sm_90").read_bytes()[:4] == b"\x7fELF"
        assert "__fdividef" in render_epilogue("float32", Epilogue("", activation, gated=True), 4).code
        assert "__fdividef" not in render_epilogue("float64", Epilogue("n", activation), 2).code
        fused = render(config_from_name("64x64x16_w32x32_t4x8_v44_s3_pad_g8_k1_o2"),
                       Problem(64, 64, 64, epilogue=Epilogue("n", activation))).code
        assert accurate in fused and "__fdividef" not in fused
    for activation in ("gelu_tanh", "relu"):
        assert "__fdividef" not in render_epilogue("bfloat16", Epilogue("n", activation), 2).code


def test_the_host_check_catches_a_wrong_activation(on_host):
    # the check can fail: the tanh form computed where the erf form is asked for misses the bound
    # at FP32 (the two GELUs differ by up to about 1e-3 near |x| = 2)
    d, bias, _, residual = on_host[WRONG_GELU].T
    asked = Epilogue("n", "gelu", True)
    expected = reference(Y.reshape(1, -1), asked, bias=bias, residual=residual.reshape(1, -1)).ravel()
    pre = Y + bias
    bound = error_bound(2.0 ** -24 * np.abs(pre), asked, np.abs(expected), 2.0 ** -24, np.abs(residual) + np.abs(expected),
                        pre_activation_magnitude=np.abs(pre), accumulator_unit_roundoff=2.0 ** -24)
    assert np.any(np.abs(d - expected) > bound)


# ---- the families that apply an epilogue in their own store -------------------------------------------

FUSED_EPILOGUES = [Epilogue("n", "gelu", True), Epilogue("n", "silu", False, "float32"), Epilogue("", "relu", True),
                   Epilogue("n", "gelu_tanh", True, "bfloat16")]


def _fused_variants():
    """test_compile's GEMV sample (both B paths, split-K, operands swapped, every dtype and layout),
    each with an epilogue in turn (one whose output dtype the products can be written as)."""
    from test_compile import _gemv_variants

    from autogemm.problem import Device

    variants = []
    for i, (config, problem) in enumerate(_gemv_variants(Device.for_arch("sm_90"))):
        epilogue = FUSED_EPILOGUES[i % len(FUSED_EPILOGUES)]
        if epilogue.out_dtype and epilogue.out_dtype not in OUTPUT_DTYPES[problem.dtype]:
            epilogue = Epilogue(epilogue.bias, epilogue.activation, epilogue.residual)
        variants.append((config, dataclasses.replace(problem, epilogue=epilogue)))
    return variants


def test_the_gemv_family_applies_every_epilogue_and_compiles():
    from autogemm.kernels.render import render

    variants = _fused_variants()
    assert {c.split_k > 1 for c, _ in variants} == {False, True} and {c.swaps_operands for c, _ in variants} == {False, True}
    assert {p.trans_b for _, p in variants} == {False, True}
    sources = {render(c, p).digest: (c, p, render(c, p)) for c, p in variants}
    for config, problem, source in sources.values():
        kernel_problem = config.kernel_problem(problem)
        assert source.kernel.endswith("_" + kernel_problem.epilogue.identifier)  # the name says it
        assert "epilogue_value(alpha * sum" in source.code
        # the epilogue's operands come last, before only a Hopper split-K's workspace
        parameters = source.parameters(source.kernel)
        if parameters[-2:] == ("partials", "counters"):
            parameters = parameters[:-2]
        assert parameters[-4:] == ("bias", "residual", "ldr", "stride_r")
        # the bias runs along the kernel's own axis: M where the operands are swapped
        assert kernel_problem.epilogue.bias == ("m" if config.swaps_operands and problem.epilogue.bias else
                                                problem.epilogue.bias)
        bare = render(config, dataclasses.replace(problem, epilogue=Epilogue())).code
        assert "epilogue" not in bare.lower().replace("epilogue's", "")  # nothing of it in the bare kernel
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        reports = list(pool.map(lambda s: (s, nvrtc_resources(s[2], "sm_90")), sources.values()))
    for (config, problem, source), report in reports:
        usage = report[source.kernel]
        assert usage.spill_store_bytes == 0, (config.name, str(problem), usage)


# the tile families: D in the operands' dtype, no gate (the rest is GEMV's and the unfused kernel's)
TILE_EPILOGUES = [Epilogue("n", "gelu", True), Epilogue("n", "silu"), Epilogue("", "relu", True),
                  Epilogue("n", "gelu_tanh"), Epilogue("", "", True)]


def _tile_variants():
    """test_compile's sm_90 samples of the SIMT, tensor-core (WMMA, mma.sync, wgmma) and Hopper families
    whose kernels write D themselves (split in the kernel or a cluster included; a split-K reduced by
    a second kernel is refused, below), each with an epilogue in turn, where its check takes the epilogue (a
    ping-pong split-K tile wider than 192 does not: it spills with one)."""
    from test_compile import _variants

    variants = []
    device = Device.for_arch("sm_90")
    for family in ("simt", "tensor_core", "hopper"):
        for i, (config, problem) in enumerate(_variants(family, "sm_90")):
            fused = dataclasses.replace(problem, epilogue=TILE_EPILOGUES[i % len(TILE_EPILOGUES)])
            if config.applies_epilogue and not config.check(fused, device):
                variants.append((config, fused))
    return variants


# what a tile kernel's store with an epilogue depends on: the family and instruction path, the launch kind
# (splits added up in the kernel or a cluster, TMA), the operands swapped (C written transposed) with and
# without the TMA store, the layout, the dtype and the epilogue
TILE_FEATURES = (lambda c, p: (c.family, getattr(c, "instruction", "")), lambda c, p: c.launch_kind,
                 lambda c, p: (c.swaps_operands, getattr(c, "tma_store", None)), lambda c, p: p.layout,
                 lambda c, p: (p.dtype, p.compute), lambda c, p: p.epilogue.key)


def _tile_sample():
    """A few of `_tile_variants` that together show every value of TILE_FEATURES that all of them show
    (test_compile's `_covering`): each store path once, not each sampled config (the bare kernels of all
    of them compile in test_compile)."""
    from test_compile import _covering

    return _covering(_tile_variants(), TILE_FEATURES)


def test_the_tile_families_apply_the_epilogue_in_their_store_and_compile_without_spills():
    from autogemm.families import LaunchKind
    from autogemm.kernels.render import render

    variants = _tile_sample()
    # every family and instruction path, the kernels that add their splits up, C written transposed
    assert {c.family for c, _ in variants} == {"simt", "wmma", "hopper"}
    assert {getattr(c, "instruction", "") for c, _ in variants} >= {"wmma", "mma", "wgmma"}
    assert {c.launch_kind for c, _ in variants} == {LaunchKind.TILES, LaunchKind.SPLIT_K_FUSED,
                                                    LaunchKind.SPLIT_K_CLUSTER, LaunchKind.TMA}
    assert any(c.swaps_operands for c, _ in variants) and any(getattr(c, "tma_store", False) for c, _ in variants)
    sources = {render(c, p).digest: (c, p, render(c, p)) for c, p in variants}
    for config, problem, source in sources.values():
        kernel_problem = config.kernel_problem(problem)
        assert source.kernel.endswith("_" + kernel_problem.epilogue.identifier), source.kernel
        assert "epilogue_at(" in source.code and "epilogue_value(" in source.code
        # the epilogue's operands come last, before only a Hopper split-K's workspace
        parameters = source.parameters(source.kernel)
        if parameters[-2:] == ("partials", "counters"):
            parameters = parameters[:-2]
        assert parameters[-4:] == ("bias", "residual", "ldr", "stride_r")
        # a residual may be D itself (written in place): C is not declared __restrict__ then
        assert ("* __restrict__ C" in source.code) != problem.epilogue.residual, source.kernel
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        reports = list(pool.map(lambda s: (s, nvrtc_resources(s[2], "sm_90" + s[2].arch_suffix)), sources.values()))
    for (config, problem, source), report in reports:
        usage = report[source.kernel]
        assert usage.spill_store_bytes == 0, (config.name, str(problem), usage)


def test_a_kernel_that_cannot_apply_the_epilogue_is_not_rendered_for_one():
    from autogemm.families import config_from_name
    from autogemm.kernels.render import render
    from autogemm.problem import Problem

    simt = config_from_name("64x64x16_w32x32_t4x8_v44_s3_pad_g8_k1_o2")
    assert render(simt, Problem(64, 64, 64, epilogue=Epilogue("n", "gelu"))).kernel.endswith("_bias_n_gelu")
    # split-K reduced by a second kernel: the kernel writes partial sums
    with pytest.raises(ValueError, match="bias_n\\+gelu: its kernel writes partial sums \\(tiles, split-K 2\\)"):
        render(dataclasses.replace(simt, split_k=2), Problem(64, 64, 256, epilogue=Epilogue("n", "gelu")))
    with pytest.raises(ValueError, match="stream_k"):
        render(dataclasses.replace(simt, stream_k=True), Problem(64, 64, 256, epilogue=Epilogue("n", "gelu")))
    # D in another dtype, and the gate, are GEMV's and the unfused kernel's
    with pytest.raises(ValueError, match="the simt family writes D in the operands' dtype, not bfloat16"):
        render(simt, Problem(64, 64, 64, epilogue=Epilogue("n", "gelu", out_dtype="bfloat16")))
    with pytest.raises(ValueError, match="the simt family applies no gated epilogue"):
        render(simt, Problem(64, 64, 64, epilogue=Epilogue("n", "silu", gated=True)))


@pytest.mark.parametrize("dtype,epilogue", GATED_CASES, ids=["bfloat16-swiglu", "float32-geglu"])
def test_the_gated_arithmetic_stays_within_its_bound_of_the_float64_reference(dtype, epilogue, on_host):
    row, out = dtypes.lookup(dtype), dtypes.lookup(epilogue.output_dtype(dtype))
    up = UP
    d, bias_gate, bias_up, residual = on_host[(dtype, epilogue)].T
    assert d.size == Y.size
    product = np.concatenate([Y, up]).reshape(1, -1)
    expected = reference(product, epilogue, bias=np.concatenate([bias_gate, bias_up]),
                         residual=residual.reshape(1, -1) if epilogue.residual else None).ravel()
    u_acc = row.accumulator_roundoff
    gate, upped = Y + bias_gate, up + bias_up
    activated = np.abs(reference(gate.reshape(1, -1), Epilogue(activation=epilogue.activation)).ravel())
    bound = error_bound(u_acc * np.abs(gate), epilogue, np.abs(expected), out.element_roundoff,
                        np.abs(residual) + np.abs(expected) if epilogue.residual else 0.0,
                        pre_activation_magnitude=np.abs(gate), accumulator_unit_roundoff=u_acc,
                        out_smallest_normal=out.smallest_normal, up_magnitude=np.abs(upped),
                        up_bound=u_acc * np.abs(upped), activated_magnitude=activated)
    error = np.abs(d - expected)
    assert np.all(error <= bound), (error / bound).max()
    # and the check can fail: the halves swapped (act(up) * gate) miss it
    swapped = reference(np.concatenate([up, Y]).reshape(1, -1), epilogue,
                        bias=np.concatenate([bias_up, bias_gate]),
                        residual=residual.reshape(1, -1) if epilogue.residual else None).ravel()
    assert np.any(np.abs(swapped - expected) > bound)


def _pass_coverage(rows: int, m: int, n: int, vector: int, sms: int = 132) -> np.ndarray:
    """How often the pass's loops (templates/epilogue.cu.j2, replayed) visit each pack of each of `rows`
    rows (matrices of `m` rows) of `n` columns, on the grid and blocks epilogue_pass gives them."""
    from autogemm.gpu.epilogue_pass import launch_shape

    (across, down, _), (threads, _, _) = launch_shape(rows, n, sms, vector)
    packs = -(-n // vector)
    seen = np.zeros((rows, packs), dtype=np.int64)
    batch = rows // m
    step_b, step_m = divmod(down, m)
    for y in range(down):
        b, row = divmod(y, m)
        while b < batch:
            for start in range(0, across * threads):
                seen[b * m + row, start:packs:across * threads] += 1
            row += step_m
            b += step_b
            if row >= m:
                row -= m
                b += 1
    return seen


@pytest.mark.parametrize("rows,m,n,vector", [(1, 1, 14336, 8), (4096, 4096, 14336, 8), (8192, 8192, 5120, 8),
                                             (512, 512, 28672, 8), (3, 1, 1, 1), (24, 8, 1000, 2), (5, 5, 10 ** 5, 1)])
def test_the_pass_grid_visits_every_column_of_every_row_once(rows, m, n, vector):
    assert np.all(_pass_coverage(rows, m, n, vector) == 1)


def test_the_pass_steps_matrices_and_rows_past_grid_ys_limit(monkeypatch):
    # rows beyond grid y: each block's next row is gridDim.y rows on, across the matrices' boundaries
    from autogemm.gpu import epilogue_pass

    monkeypatch.setattr(epilogue_pass, "MAX_GRID_Y", 7)
    assert epilogue_pass.launch_shape(3 * 5, 64, 132, 8)[0][1] == 7
    assert np.all(_pass_coverage(3 * 5, 5, 64, 8) == 1) and np.all(_pass_coverage(4 * 3, 3, 64, 8) == 1)
    assert np.all(_pass_coverage(2 * 11, 11, 64, 8) == 1)


def test_the_pass_grid_gives_a_block_a_row_where_the_rows_fill_the_gpu_and_spreads_short_ones():
    from autogemm.gpu.epilogue_pass import MAX_GRID_Y, THREADS_PER_SM, block_width, launch_shape

    def grid(rows, n, sms, vector=1):
        grid, block = launch_shape(rows, n, sms, vector)
        assert block == (block_width(n, vector), 1, 1)
        return grid

    assert grid(4096, 14336, 132, 8) == (4, 4096, 1)  # the rows fill the GPU: 4 blocks a row, 4 packs a thread
    assert grid(8192, 1024, 132, 8) == (1, 8192, 1)  # a narrow row: a block sweeps it, a pack a thread
    assert grid(1, 14336, 132, 8) == (14, 1, 1)  # one row: blocks along it, a pack a thread
    across, down, _ = grid(512, 28672, 132, 8)  # 512 rows: blocks along a row for a round of every SM
    assert down == 512 and across * down >= 132 * THREADS_PER_SM // 128 and across < 28672 // 8 // 128
    assert grid(10 ** 7, 8, 132)[1] == MAX_GRID_Y and grid(3, 1, 132) == (1, 3, 1)
    # block widths that leave no thread idle at a row's end where a wide block would leave many
    assert block_width(14336, 8) == 128 and block_width(512, 8) == 64 and block_width(8, 8) == 32
    assert block_width(13824, 8) == 128  # a 28th of the slots idle: within IDLE_SHARE
