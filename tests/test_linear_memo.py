"""linear's first memo (serving/linear_memo.py): a layer that F.linear serves whole is found by its weight's and
bias's identity and x's metadata, and only then. CPU: torch's CPU tensors and a plan whose F.linear is a spy,
filed as the general path files it (under linear's full key, dispatch.linear)."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from autogemm.serving import dispatch, epilogue_step, linear_memo  # noqa: E402
from autogemm.serving.eager_epilogue import TorchEagerEpiloguePlan  # noqa: E402
from autogemm.serving.planning import Dispatcher  # noqa: E402


class Layer:
    """A dispatcher of its own with one whole-F.linear plan filed under linear's full key for (x, w, bias)."""

    def __init__(self, monkeypatch, x, w, bias, finish=None):
        self.dispatcher = Dispatcher()
        monkeypatch.setattr(dispatch, "_DISPATCHER", self.dispatcher)
        monkeypatch.setattr(dispatch, "_TENSOR", torch.Tensor)
        self.gemm = SimpleNamespace(launch=None, torch_matmul=None, device=-1)
        self.dispatcher.torch_fast["gemm"] = self.gemm
        self.plan = TorchEagerEpiloguePlan(self.dispatcher, "gemm", self.gemm, finish, -1, transposed=False)
        self.calls = []
        self.plan._linear = lambda a, weight, b=None: self.calls.append((a, weight, b)) or a
        self.dispatcher.torch_epilogue[epilogue_step.torch_linear_key(x, w, bias, None, None, None, False)] = self.plan

    def file_again(self, x, w, bias):
        self.dispatcher.torch_epilogue[epilogue_step.torch_linear_key(x, w, bias, None, None, None, False)] = self.plan

    def first_memo_serves(self, x, w, bias) -> bool:
        """Whether the first memo alone serves this call (the full key's memo emptied meanwhile)."""
        full = dict(self.dispatcher.torch_epilogue)
        self.dispatcher.torch_epilogue.clear()
        self.dispatcher.torch_epilogue["(something, so that linear looks)"] = None
        before = len(self.calls)
        try:
            dispatch.linear(x, w, bias)
        except Exception:  # (the general path on CPU tensors: not served here)
            return False
        finally:
            self.dispatcher.torch_epilogue.clear()
            self.dispatcher.torch_epilogue.update(full)
        return len(self.calls) == before + 1


def _tensors():
    return torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16), \
        torch.randn(8, dtype=torch.bfloat16)


def test_a_layer_served_whole_by_f_linear_is_found_by_its_weights_identity(monkeypatch):
    x, w, bias = _tensors()
    layer = Layer(monkeypatch, x, w, bias)
    assert dispatch.linear(x, w, bias) is x  # (the full key's plan; files the first memo's entry)
    assert len(layer.dispatcher.linear_by_weight) == 1
    assert layer.first_memo_serves(x, w, bias)
    assert layer.first_memo_serves(torch.randn(4, 16, dtype=torch.bfloat16), w, bias)  # another x of the same shape
    assert layer.calls[-1][1] is w and layer.calls[-1][2] is bias


def test_another_weight_bias_or_shape_of_x_is_not_found_there(monkeypatch):
    x, w, bias = _tensors()
    layer = Layer(monkeypatch, x, w, bias)
    dispatch.linear(x, w, bias)
    assert not layer.first_memo_serves(x, w.clone(), bias)
    assert not layer.first_memo_serves(x, w, bias.clone())
    assert not layer.first_memo_serves(x, w, None)
    assert not layer.first_memo_serves(torch.randn(5, 16, dtype=torch.bfloat16), w, bias)
    assert not layer.first_memo_serves(x.half(), w, bias)


def test_an_entry_holds_its_tensors_weakly_and_knows_them_from_others_at_their_ids():
    w, bias = torch.randn(8, 16), torch.randn(8)
    entry = linear_memo.Entry(w, bias, plan=None)
    assert entry.matches(w, bias)
    assert not entry.matches(w, None) and not entry.matches(torch.randn(8, 16), bias)
    assert not linear_memo.Entry(w, None, plan=None).matches(w, bias)
    del w
    gc.collect()
    assert entry.weight() is None  # (a tensor born at the dead weight's id is not it)


@pytest.mark.parametrize("which", ["x", "weight", "bias"])
def test_tensors_that_record_a_gradient_go_the_full_path(monkeypatch, which):
    x, w, bias = _tensors()
    layer = Layer(monkeypatch, x, w, bias)
    dispatch.linear(x, w, bias)
    {"x": x, "weight": w, "bias": bias}[which].requires_grad_()
    assert not layer.first_memo_serves(x, w, bias)


class _Pass:
    """A pass after F.linear (it reads addresses): accepts every call, does nothing."""

    bias_in_linear = bias_left_by_tune = False

    def accepts(self, bias, residual):
        return True

    def __call__(self, y, bias, residual):
        pass


def test_only_plans_f_linear_serves_whole_are_filed(monkeypatch):
    x, w, bias = _tensors()
    layer = Layer(monkeypatch, x, w, bias, finish=_Pass())
    assert dispatch.linear(x, w, bias) is x
    assert layer.calls and not layer.dispatcher.linear_by_weight
    transposed = TorchEagerEpiloguePlan(layer.dispatcher, "gemm", layer.gemm, None, -1)  # (matmul's key: b is wᵀ)
    assert not linear_memo.serves_whole(transposed)
    assert not linear_memo.serves_whole(SimpleNamespace(finish=None, transposed=False))
    assert linear_memo.serves_whole(layer.plan.as_linear().__class__(layer.dispatcher, "gemm", layer.gemm, None, -1,
                                                                     transposed=False))


def test_the_memo_is_emptied_when_a_torch_fast_plan_is_replaced_or_retired_and_on_clear(monkeypatch):
    # (its entries are served without looking the GEMM's plan up: the dispatcher keeps them current)
    x, w, bias = _tensors()
    layer = Layer(monkeypatch, x, w, bias)
    dispatcher = layer.dispatcher
    dispatch.linear(x, w, bias)
    newcomer = SimpleNamespace(fast_key="another", torch_keys=None)
    dispatcher.fast["another"] = newcomer
    assert dispatcher.keep_torch("another key", newcomer)  # a plan for another key: the memo stays
    assert dispatcher.linear_by_weight
    assert dispatcher.keep_torch("gemm", newcomer)  # the GEMM's plan replaced
    assert not dispatcher.linear_by_weight
    assert not layer.first_memo_serves(x, w, bias)  # (the full key's plan gives None: not current)
    dispatcher.torch_fast["gemm"] = layer.gemm
    dispatch.linear(x, w, bias)
    assert dispatcher.linear_by_weight
    layer.gemm.torch_keys, layer.gemm.fast_key = ["gemm"], None
    dispatcher._retire(layer.gemm)  # evicted or replaced in the plan memo
    assert "gemm" not in dispatcher.torch_fast and not dispatcher.linear_by_weight
    dispatcher.torch_fast["gemm"] = layer.gemm
    dispatch.linear(x, w, bias)
    assert dispatcher.linear_by_weight
    dispatcher.clear()
    assert not dispatcher.linear_by_weight


def test_a_call_the_memo_serves_looks_nothing_else_up(monkeypatch):
    x, w, bias = _tensors()
    layer = Layer(monkeypatch, x, w, bias)
    dispatch.linear(x, w, bias)
    layer.dispatcher.torch_fast = fast = _CountingDict(layer.dispatcher.torch_fast)
    assert layer.first_memo_serves(x, w, bias)
    assert fast.lookups == 0


class _CountingDict(dict):
    """A dict that counts its lookups."""

    lookups = 0

    def get(self, *args):
        self.lookups += 1
        return super().get(*args)


@pytest.mark.parametrize("keywords", [{"activation": "gelu"}, {"residual": "x"}, {"gated": True}])
def test_a_layer_that_f_linear_cannot_serve_whole_never_looks_in_the_memo(monkeypatch, keywords):
    # (a GELU layer among bias layers that filled the memo would build the key and miss on every call)
    x, w, bias = _tensors()
    layer = Layer(monkeypatch, x, w, bias)
    dispatch.linear(x, w, bias)  # files the bias layer's entry
    memo = _CountingDict(layer.dispatcher.linear_by_weight)
    layer.dispatcher.linear_by_weight = memo
    assert layer.first_memo_serves(x, w, bias) and memo.lookups == 1
    if keywords.get("residual") == "x":
        keywords = {"residual": torch.randn(4, 8, dtype=torch.bfloat16)}
    with pytest.raises(Exception):  # (the general path on CPU tensors)
        dispatch.linear(x, w, bias, **keywords)
    assert memo.lookups == 1
