"""F.linear's cuBLASLt call prepared once (serving/lt_linear.py), on the CPU: what a call launches, where its
output comes from, what it refuses to F.linear, and the workspace size it reads from the environment."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autogemm.serving import lt_linear, torch_fast_path


class _Launch:
    """A stand-in for cublas_epilogue.prepared_bias_launcher's launch: the calls asked of it."""

    def __init__(self):
        self.calls = []

    def __call__(self, pa, pb, pd, stream, pbias):
        self.calls.append((pa, pb, pd, stream, pbias))


@pytest.fixture
def layer(monkeypatch):
    torch = pytest.importorskip("torch")
    from autogemm.gpu import capture
    from autogemm.serving import plan as plan_module

    monkeypatch.setattr(plan_module, "torch_raw_stream", lambda device: 7)
    monkeypatch.setattr(capture, "capturing", lambda stream: False)
    monkeypatch.setattr(lt_linear, "ALIGNMENT", 1)  # (a CPU allocator's blocks keep 64 bytes, not 256)
    torch.manual_seed(2)
    x = torch.randn(3, 5, 32, dtype=torch.bfloat16)
    w = torch.randn(32, 32, dtype=torch.bfloat16)
    bias = torch.randn(32, dtype=torch.bfloat16)
    launch = _Launch()
    prepared = lt_linear.PreparedBiasLinear(SimpleNamespace(reserve_spare=lambda nbytes: True), launch, x, w, bias,
                                            torch.empty(3, 5, 32, dtype=torch.bfloat16), -1)
    prepared._current_device = lambda: -1  # (PyTorch's readers need a GPU)
    prepared._capturing = lambda: False
    return SimpleNamespace(torch=torch, x=x, w=w, bias=bias, launch=launch, prepared=prepared)


def test_a_call_launches_on_its_own_addresses_into_the_output_made_after_the_last_launch(layer):
    x, w, bias = layer.x, layer.w, layer.bias
    first = layer.prepared(x, w, bias)
    assert first.shape == (3, 5, 32) and first.dtype == layer.torch.bfloat16 and first.is_contiguous()
    spare = layer.prepared.outputs.spares[7]  # made after the launch, for the next call on stream 7
    second = layer.prepared(x, w, bias)
    assert second is spare and second.data_ptr() != first.data_ptr()
    assert layer.launch.calls == [(x.data_ptr(), w.data_ptr(), y.data_ptr(), 7, bias.data_ptr()) for y in (first, second)]
    other_bias = layer.torch.randn(32, dtype=layer.torch.bfloat16)  # (another bias of the same layout: its address)
    third = layer.prepared(x, w, other_bias)
    assert layer.launch.calls[-1] == (x.data_ptr(), w.data_ptr(), third.data_ptr(), 7, other_bias.data_ptr())


@pytest.mark.parametrize("change", ["weight of another shape", "weight transposed in place", "weight of another dtype",
                                    "bias of another shape", "negated x", "another device current",
                                    "a graph capturing", "a graph capturing (CuPy's reader)",
                                    "another stream capturing", "an address less aligned"])
def test_a_call_that_does_not_suit_is_refused_before_any_launch(layer, change, monkeypatch):
    torch, x, w, bias = layer.torch, layer.x, layer.w, layer.bias
    from autogemm.gpu import capture

    if change == "weight of another shape":  # (`.data =` keeps the tensor, so the memo's identity key still finds it)
        w.data = torch.randn(16, 32, dtype=torch.bfloat16)
    elif change == "weight transposed in place":
        w.data = w.data.t()
    elif change == "weight of another dtype":
        w.data = w.data.view(torch.float16)
    elif change == "bias of another shape":
        bias = torch.randn(1, 32, dtype=torch.bfloat16)
    elif change == "negated x":
        x = torch._neg_view(x)
    elif change == "another device current":
        layer.prepared._current_device = lambda: 1
    elif change == "a graph capturing":
        layer.prepared._capturing = lambda: True
    elif change == "a graph capturing (CuPy's reader)":  # (a PyTorch without its own)
        layer.prepared._capturing = None
        monkeypatch.setattr(capture, "capturing", lambda stream: stream == 7)
    elif change == "another stream capturing":
        def joins(stream=None):
            raise capture.CaptureError("the legacy default stream while another stream captures")
        layer.prepared._capturing = joins
    else:
        monkeypatch.setattr(lt_linear, "ALIGNMENT", 1 << 40)
    assert layer.prepared(x, w, bias) is None
    assert layer.launch.calls == []


def test_the_plan_serves_f_linear_where_its_prepared_call_refuses(layer):
    """eager_epilogue.TorchEagerEpiloguePlan.call_whole: the prepared call first, F.linear where it refuses."""
    torch, x, w, bias = layer.torch, layer.x, layer.w, layer.bias
    from autogemm.serving.eager_epilogue import TorchEagerEpiloguePlan

    gemm = SimpleNamespace(torch_matmul=torch.matmul, device=-1)
    plan = TorchEagerEpiloguePlan(SimpleNamespace(torch_fast={"gemm": gemm}), "gemm", gemm, None, -1, False, layer.prepared)
    assert plan.call_whole(x, w, bias) is not None and len(layer.launch.calls) == 1
    assert plan.as_linear().prepared is layer.prepared and plan.outputs is layer.prepared.outputs
    w.data = torch.randn(16, 32, dtype=torch.bfloat16)
    assert torch.equal(plan.call_whole(x, w, bias[:16]), torch.nn.functional.linear(x, w, bias[:16]))
    assert len(layer.launch.calls) == 1


@pytest.mark.parametrize("value,kib,warns", [(None, 1024, False), ("", 1024, False), ("4096", 4096, False),
                                             ("0", 0, False), ("32768", 32768, False), ("32769", 1024, True),
                                             ("-1", 1024, True), ("1e3", 1024, True), ("4096; rm", 1024, True)])
def test_the_workspace_is_pytorchs_size_read_from_its_variable_and_checked(value, kib, warns, monkeypatch, recwarn):
    if value is None:
        monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    else:
        monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", value)
    assert lt_linear.torch_workspace_bytes() == kib * 1024
    assert bool([w for w in recwarn if "CUBLASLT_WORKSPACE_SIZE" in str(w.message)]) is warns


def test_each_threads_first_call_outside_a_capture_has_pytorch_make_its_cublas_handle(layer, monkeypatch):
    # under a capture the call steps aside for F.linear, which needs the thread's cuBLAS handle of PyTorch's, and
    # cublasCreate fails inside a capture: a thread's first uncaptured call has PyTorch make it, once
    import threading

    made = []
    monkeypatch.setattr(layer.torch.cuda, "current_blas_handle", lambda: made.append(threading.get_ident()))
    monkeypatch.setattr(torch_fast_path, "_this_thread", threading.local())  # (as in a process that made none yet)
    x, w, bias = layer.x, layer.w, layer.bias

    def calls(capturing_first: bool):
        if capturing_first:
            layer.prepared._capturing = lambda: True
            assert layer.prepared(x, w, bias) is None  # (F.linear's: nothing made inside the capture)
            layer.prepared._capturing = lambda: False
        for _ in range(3):
            assert layer.prepared(x, w, bias) is not None

    calls(False)
    assert made == [threading.get_ident()]
    thread = threading.Thread(target=calls, args=(True,))
    thread.start()
    thread.join()
    assert len(made) == 2 and made[1] != made[0]
