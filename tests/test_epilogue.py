"""The epilogue's vocabulary without a GPU: keys (alone and in problem keys), validation, the float64
reference (activation values, the order of bias, activation, residual and beta·C) and the error bound."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from autogemm.epilogue import ACTIVATIONS, EVALUATION_ROUNDINGS, SLOPES, Epilogue, activate, error_bound, reference
from autogemm.problem import Problem

ALL = [Epilogue(bias, activation, residual, out)
       for bias, activation, residual, out in itertools.product(("", "n", "m"), ("", *ACTIVATIONS), (False, True),
                                                                 ("", "bfloat16", "float32"))]


def test_every_epilogue_has_one_key_that_reads_back():
    keys = [e.key for e in ALL]
    assert len(set(keys)) == len(keys)
    assert Epilogue().key == "" and Epilogue().is_identity
    for epilogue in ALL[1:]:
        assert not epilogue.is_identity and Epilogue.from_key(epilogue.key) == epilogue
    assert Epilogue("n", "gelu", True, "bfloat16").key == "bias_n+gelu+res>bfloat16"


@pytest.mark.parametrize("key", ["", "gelu+bias_n", "bias_x", "tanh", "res+gelu", "bias_n++gelu", "bias_n+",
                                 ">float32x", "gelu>int8", "bias_n+relu+gelu", "relu+res+res"])
def test_other_spellings_are_not_epilogue_keys(key):
    with pytest.raises(ValueError):
        Epilogue.from_key(key)


def test_bad_fields_are_refused_by_name():
    with pytest.raises(ValueError, match="activation 'tanh'"):
        Epilogue(activation="tanh")
    with pytest.raises(ValueError, match="bias"):
        Epilogue(bias="k")
    with pytest.raises(ValueError, match="output dtype 'int8'"):
        Epilogue(out_dtype="int8")
    with pytest.raises(TypeError, match="residual"):
        Epilogue(residual=1)
    with pytest.raises(TypeError, match="epilogue"):
        Problem(4, 4, 4, epilogue="bias_n")


def test_problem_keys_carry_the_epilogue_and_bare_keys_stay_as_they_were():
    bare = Problem(16, 4096, 4096, dtype="float16", trans_b=True)
    assert bare.key == "float16/fp32/nt/b1/16x4096x4096" and Problem.from_key(bare.key) == bare
    fused = Problem(16, 4096, 4096, dtype="float16", trans_b=True, epilogue=Epilogue("n", "silu"))
    assert fused.key == "float16/fp32/nt/b1/16x4096x4096/bias_n+silu"
    assert Problem.from_key(fused.key) == fused and fused != bare and "bias_n+silu" in str(fused)
    for bad in ("float16/fp32/nt/b1/16x4096x4096/", "float16/fp32/nt/b1/16x4096x4096/bias_q",
                "float16/fp32/nt/b1/16x4096x4096/gelu/relu", "float16/fp32/nt/b1/16x4096x4096/../../x"):
        with pytest.raises(ValueError):
            Problem.from_key(bad)


def test_swapping_the_operands_moves_the_bias_to_the_other_axis():
    problem = Problem(8, 32, 16, epilogue=Epilogue("n", "relu", True))
    swapped = problem.swapped()
    assert (swapped.m, swapped.n, swapped.epilogue) == (32, 8, Epilogue("m", "relu", True))
    assert swapped.swapped() == problem
    assert Problem(8, 32, 16).swapped().epilogue == Epilogue()


def test_activations_have_their_closed_forms():
    x = np.array([-3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 2.0, 6.0])
    assert np.array_equal(activate(x, "relu"), np.maximum(x, 0))
    gelu = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    assert np.allclose(activate(x, "gelu"), gelu, rtol=1e-15, atol=1e-300)
    assert activate(np.array([1.0]), "gelu")[0] == pytest.approx(0.8413447460685429, rel=1e-14)
    assert activate(np.array([1.0]), "gelu_tanh")[0] == pytest.approx(0.8411919906082768, rel=1e-14)
    assert activate(np.array([1.0]), "silu")[0] == pytest.approx(0.7310585786300049, rel=1e-14)
    assert activate(x, "") is x
    with pytest.raises(ValueError, match="swish"):
        activate(x, "swish")


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_each_slope_bounds_the_activations_derivative_and_is_tight(activation):
    x = np.linspace(-12, 12, 240001)
    steepest = np.max(np.abs(np.diff(activate(x, activation)) / np.diff(x)))
    assert steepest <= SLOPES[activation] and steepest >= 0.99 * SLOPES[activation]


def test_the_reference_adds_the_bias_then_activates_then_adds_the_residual_and_beta_c():
    rng = np.random.default_rng(0)
    product, c, residual = rng.uniform(-1, 1, (3, 4)), rng.uniform(-1, 1, (3, 4)), rng.uniform(-1, 1, (3, 4))
    along_n, along_m = rng.uniform(-1, 1, 4), rng.uniform(-1, 1, 3)
    got = reference(product, Epilogue("n", "relu", True), alpha=2.0, beta=0.5, c=c, bias=along_n, residual=residual)
    assert np.allclose(got, np.maximum(2.0 * product + along_n[None, :], 0) + residual + 0.5 * c)
    got = reference(product, Epilogue("m", "silu"), bias=along_m)
    y = product + along_m[:, None]
    assert np.allclose(got, y / (1 + np.exp(-y)))
    assert np.array_equal(reference(product, Epilogue()), product)
    batched = rng.uniform(-1, 1, (2, 3, 4))
    assert np.allclose(reference(batched, Epilogue("n"), bias=along_n), batched + along_n)
    with pytest.raises(ValueError, match="bias"):
        reference(product, Epilogue("n"))
    with pytest.raises(ValueError, match="residual"):
        reference(product, Epilogue(residual=True))


def test_the_error_bound_grows_the_products_bound_by_the_slope_and_adds_the_epilogues_roundings():
    base = np.array([1e-3, 2e-3])
    magnitude = np.array([1.0, 4.0])
    u = 2.0 ** -8  # bfloat16's unit roundoff
    plain = error_bound(base, Epilogue(), magnitude, u)
    assert np.allclose(plain, base + 2 * u * magnitude)
    gelu = error_bound(base, Epilogue(activation="gelu"), magnitude, u)
    assert np.allclose(gelu, SLOPES["gelu"] * base + 2 * u * magnitude)
    with_residual = error_bound(base, Epilogue(residual=True), magnitude, u, residual_magnitude=np.array([3.0, 0.0]))
    assert with_residual[0] > plain[0] and with_residual[1] == plain[1]
    # the activation's own evaluation in the accumulator: relative to what it is given, not to its result
    evaluated = error_bound(base, Epilogue(activation="silu"), magnitude, u, pre_activation_magnitude=np.array([8.0, 0.0]),
                            accumulator_unit_roundoff=2.0 ** -24)
    assert np.allclose(evaluated - error_bound(base, Epilogue(activation="silu"), magnitude, u),
                       [EVALUATION_ROUNDINGS["silu"] * 2.0 ** -24 * 8.0, 0.0])
    assert np.array_equal(error_bound(base, Epilogue(activation="relu"), magnitude, u, pre_activation_magnitude=8.0,
                                      accumulator_unit_roundoff=2.0 ** -24),
                          error_bound(base, Epilogue(activation="relu"), magnitude, u))  # relu rounds nothing
    # FP16's subnormals: half their spacing, whatever the result's size
    assert np.allclose(error_bound(0.0, Epilogue(), 0.0, 2.0 ** -11, out_smallest_normal=2.0 ** -14), 2.0 ** -25)


def test_tuning_and_the_cache_take_bias_activation_and_residual_but_not_another_dtype_or_a_gate():
    # (a fused kernel writes D in the operands' dtype without a gate: nothing is tuned or recorded under
    # such a key; bias, activation and residual are measured with the epilogue)
    from autogemm.families import config_from_name
    from autogemm.kernels.render import render
    from autogemm.problem import Device
    from autogemm.results.record import Record
    from autogemm.tuning.tuner import tune

    fused = Problem(64, 64, 64, epilogue=Epilogue("n", "gelu"))
    config = config_from_name("64x64x16_w32x32_t4x8_v44_s3_pad_g8_k1_o2")
    assert render(config, Problem(64, 64, 64)).kernel  # the bare problem renders
    assert render(config, fused).kernel.endswith("_bias_n_gelu")  # (the SIMT family applies it)
    # a search never draws a kernel that cannot apply the epilogue (check says why)
    split = config.replace(split_k=2)
    assert any(r.startswith("epilogue: its kernel writes partial sums") for r in
               split.check(Problem(64, 64, 256, epilogue=Epilogue("n", "gelu")), Device.for_arch("sm_90")))
    assert not split.check(Problem(64, 64, 256), Device.for_arch("sm_90"))
    record = {"problem": fused.key, "family": "cublas", "config": {}, "config_name": "cublas", "time_ms": 1.0,
              "tflops": 1.0, "cublas_ms": 1.0, "cublas_tflops": 1.0, "ratio": 1.0, "rel_error": 0.0,
              "template_hash": "", "device": "NVIDIA H100 80GB HBM3", "versions": {}, "date": "2026-11-26",
              "host": "h"}
    assert Record.from_json(record).problem_object.epilogue == Epilogue("n", "gelu")
    for refused in (Epilogue("n", "gelu", out_dtype="float16"), Epilogue("", "silu", gated=True)):
        problem = Problem(64, 128, 64, epilogue=refused)
        with pytest.raises(ValueError, match="not another output dtype or a gate"):
            tune(problem)
        with pytest.raises(ValueError, match="not another output dtype or a gate"):
            Record.from_json({**record, "problem": problem.key})


def test_a_gated_epilogue_has_its_key_its_reference_and_no_swap():
    gated = Epilogue("n", "silu", True, "bfloat16", gated=True)
    assert gated.key == "bias_n+silu+gate+res>bfloat16" and Epilogue.from_key(gated.key) == gated
    assert Epilogue.from_key("gate") == Epilogue(gated=True) and not Epilogue(gated=True).is_identity
    with pytest.raises(ValueError, match="halves are the product's columns"):
        Epilogue("m", "silu", gated=True)
    with pytest.raises(ValueError, match="not computed on the swapped product"):
        gated.swapped()
    product = np.array([[1.0, -2.0, 3.0, 0.5]])  # gate (1, -2), up (3, 0.5)
    bias = np.array([0.5, 0.0, -1.0, 1.0])
    d = reference(product, Epilogue("n", "silu", gated=True), bias=bias)
    silu = lambda x: x / (1 + np.exp(-x))  # noqa: E731
    assert np.allclose(d, [[silu(1.5) * 2.0, silu(-2.0) * 1.5]])
    # the bound: the gate's part scaled by |up|, the up half's bound by |act(gate)|
    bound = error_bound(1e-3, Epilogue(activation="silu", gated=True), 0.0, 0.0, up_magnitude=2.0, up_bound=1e-2,
                        activated_magnitude=3.0)
    assert np.isclose(bound, SLOPES["silu"] * 1e-3 * 2.0 + 3.0 * 1e-2)


def test_cublaslt_serves_the_epilogues_it_computes_and_no_others():
    from autogemm.gpu.cublas_epilogue import lt_epilogue

    assert lt_epilogue(Epilogue("n", "gelu_tanh"), "bfloat16") == "GELU_BIAS"
    assert lt_epilogue(Epilogue("n", "relu"), "float16") == "RELU_BIAS"
    assert lt_epilogue(Epilogue("", "relu"), "float32") == "RELU"
    assert lt_epilogue(Epilogue("n"), "float16") == "BIAS"
    assert lt_epilogue(Epilogue(residual=True), "bfloat16") == "DEFAULT"  # (the residual read as C)
    assert lt_epilogue(Epilogue("n", residual=True), "bfloat16") == "BIAS"
    for epilogue, dtype in [(Epilogue("n", "gelu"), "float16"),  # erf GELU: cuBLASLt's is the tanh form
                            (Epilogue("n", "silu"), "bfloat16"),  # no SiLU
                            (Epilogue("n", "relu", True), "float16"),  # C would be added before the activation
                            (Epilogue("m", "relu"), "float16"),  # a bias along M
                            (Epilogue("n", "relu", out_dtype="float32"), "float16"),  # another D dtype
                            (Epilogue("n", "silu", gated=True), "bfloat16"),
                            (Epilogue("n", "relu"), "float64"),
                            (Epilogue(out_dtype="float32"), "bfloat16")]:
        assert lt_epilogue(epilogue, dtype) is None, (epilogue, dtype)
