"""The eager handover of untuned layers (serving/eager_epilogue.py), on the CPU: which epilogues it takes,
and that its plan computes what eager PyTorch computes, refusing the calls the general path must serve."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autogemm.epilogue import Epilogue
from autogemm.serving.eager_epilogue import TorchEagerEpiloguePlan, eager_computes, eager_plan


@pytest.mark.parametrize("epilogue,dtype,weight_dims,bias_dims,expected", [
    (Epilogue("n"), "bfloat16", 2, 1, True),  # F.linear's own bias
    (Epilogue("n", "silu"), "float16", 2, 1, True),  # cuBLASLt has no SiLU
    (Epilogue("n", "gelu", True), "bfloat16", 2, 1, True),  # nor the erf GELU
    (Epilogue("", "silu", True), "bfloat16", 2, None, True),
    (Epilogue("n", "gelu_tanh"), "bfloat16", 2, 1, False),  # cuBLASLt's GELU_BIAS saves a pass
    (Epilogue("n", "relu"), "bfloat16", 2, 1, False),
    (Epilogue("n", residual=True), "bfloat16", 2, 1, False),  # the residual as cuBLASLt's C
    (Epilogue("", residual=True), "bfloat16", 2, None, False),
    (Epilogue("n", "silu"), "float32", 2, 1, False),  # torch would compute float32 in TF32 where allowed
    (Epilogue("n", "silu", gated=True), "bfloat16", 2, 1, False),  # eager's gate is two GEMMs
    (Epilogue("n", "silu", out_dtype="float32"), "bfloat16", 2, 1, False),
    (Epilogue("n", "silu"), "bfloat16", 3, 1, False),  # a batch of weights: no F.linear
    (Epilogue("m", "silu"), "bfloat16", 2, 1, False),  # a bias along M
])
def test_eager_takes_the_layers_its_own_calls_compute_and_cublaslt_does_not_fuse(epilogue, dtype, weight_dims, bias_dims,
                                                                              expected):
    assert eager_computes(epilogue, dtype, weight_dims, bias_dims) is expected
    # a vector x (matmul's semantics, not a layer's) and a bias or residual of another dtype go elsewhere too
    assert not eager_computes(epilogue, dtype, weight_dims, bias_dims, x_dims=1)
    assert not eager_computes(epilogue, dtype, weight_dims, bias_dims, one_dtype=False)


def _dispatcher_with(gemm_plan, key="gemm"):
    return SimpleNamespace(torch_fast={key: gemm_plan})


@pytest.mark.parametrize("activation,with_residual", [("", False), ("silu", False), ("gelu", False), ("silu", True),
                                                     ("gelu", True)])  # (a bias and a residual: cuBLASLt's)
def test_the_eager_plan_computes_eagers_layer_under_both_keys(activation, with_residual):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    torch.manual_seed(3)
    x = torch.randn(5, 7, 32, dtype=torch.bfloat16)  # (a batch of sequences, as a layer sees them)
    w = torch.randn(48, 32, dtype=torch.bfloat16) / 8
    bias = torch.randn(48, dtype=torch.bfloat16)
    residual = torch.randn(5, 7, 48, dtype=torch.bfloat16) if with_residual else None
    gemm = SimpleNamespace(torch_matmul=torch.matmul, device=-1)
    dispatcher = _dispatcher_with(gemm)
    epilogue = Epilogue("n", activation, with_residual)
    product = torch.matmul(x, w.mT)
    plan = eager_plan(dispatcher, "gemm", gemm, epilogue, "bfloat16", (x, w.mT), product, bias, residual)
    assert isinstance(plan, TorchEagerEpiloguePlan)
    y = F.linear(x, w, bias)
    y = {"": lambda v: v, "silu": F.silu, "gelu": F.gelu}[activation](y)
    expected = y + residual if with_residual else y
    assert torch.equal(plan.call(x, w.mT, bias, residual, 1.0), expected)  # matmul's key: b is weight's view
    assert torch.equal(plan.as_linear().call(x, w, bias, residual, 1.0), expected)  # linear's: b is the weight
    # and what the general path must serve: another alpha, a GEMM plan replaced since, another device
    assert plan.call(x, w.mT, bias, residual, 0.5) is None
    dispatcher.torch_fast["gemm"] = SimpleNamespace(torch_matmul=torch.matmul, device=-1)
    assert plan.call(x, w.mT, bias, residual, 1.0) is None
    elsewhere = eager_plan(_dispatcher_with(gemm), "gemm", SimpleNamespace(torch_matmul=torch.matmul, device=0),
                           epilogue, "bfloat16", (x, w.mT), product, bias, residual)
    assert elsewhere.call(x, w.mT, bias, residual, 1.0) is None


def test_no_eager_plan_where_a_kernel_serves_or_the_dtypes_differ():
    torch = pytest.importorskip("torch")
    x, w = torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    product = torch.matmul(x, w.mT)
    epilogue = Epilogue("n", "silu")
    cublas = SimpleNamespace(torch_matmul=torch.matmul, device=-1)
    kernel = SimpleNamespace(torch_matmul=None, device=-1)  # (a generated kernel serves the GEMM)
    bias = torch.randn(8, dtype=torch.bfloat16)
    assert eager_plan(_dispatcher_with(cublas), "gemm", cublas, epilogue, "bfloat16", (x, w.mT), product, bias, None)
    assert eager_plan(_dispatcher_with(kernel), "gemm", kernel, epilogue, "bfloat16", (x, w.mT), product, bias,
                      None) is None
    assert eager_plan(_dispatcher_with(cublas), "gemm", cublas, epilogue, "bfloat16", (x, w.mT), product,
                      bias.float(), None) is None  # (F.linear would refuse a bias of another dtype)
