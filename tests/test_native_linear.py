"""linear's memo in C++ (serving/native_linear.py, native_linear.cpp): built with the machine's compiler, it
serves a filed call with eager's own ATen calls and nothing else, gives None for everything it was not told
about, and is emptied with linear's other memos. CPU: torch's CPU tensors (what runs is ATen's, on any
device). Skipped without PyTorch, a C++ compiler or ninja; the build takes about half a minute."""

from __future__ import annotations

import logging
import shutil
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from autogemm.serving import dispatch, native_linear  # noqa: E402
from autogemm.serving.planning import Dispatcher  # noqa: E402

pytestmark = pytest.mark.native


def _buildable() -> str:
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        return "no ninja"
    if shutil.which("c++") is None:
        return "no C++ compiler"
    return ""


@pytest.fixture(scope="module")
def memo_type():
    why = _buildable()
    if why:
        pytest.skip(f"linear's C++ memo cannot be built here: {why}")
    return native_linear.load().Memo


def _layer(dtype=torch.float32, m=(3, 5), n=12, k=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*m, k, generator=g, dtype=dtype)
    w = torch.randn(n, k, generator=g, dtype=dtype)
    return x, w, torch.randn(n, generator=g, dtype=dtype), torch.randn(*m, n, generator=g, dtype=dtype)


EAGER = {None: lambda y: y, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
         "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}


@pytest.mark.parametrize("activation", list(EAGER))
@pytest.mark.parametrize("with_bias,with_residual", [(True, False), (False, True), (True, True), (False, False)])
def test_a_filed_call_gives_eagers_result_bit_for_bit(memo_type, activation, with_bias, with_residual):
    x, w, bias, residual = _layer()
    bias = bias if with_bias else None
    residual = residual if with_residual else None
    memo = memo_type(8)
    assert memo.linear(x, w, bias, activation, residual) is None  # (not filed)
    assert memo.file(x, w, bias, activation, residual)
    y = memo.linear(x, w, bias, activation, residual)
    expected = EAGER[activation](F.linear(x, w, bias))
    if residual is not None:
        expected = expected + residual
    assert y is not None and y.shape == expected.shape and torch.equal(y, expected)


def test_another_shape_stride_dtype_activation_or_operand_is_not_served(memo_type):
    x, w, bias, residual = _layer()
    memo = memo_type(8)
    memo.file(x, w, bias, "gelu", None)
    x2 = torch.randn(3, 6, 16)
    assert memo.linear(x2, w, bias, "gelu", None) is None  # another M
    assert memo.linear(x.transpose(0, 1), w, bias, "gelu", None) is None  # the same sizes permuted: other strides
    assert memo.linear(x.double(), w.double(), bias.double(), "gelu", None) is None
    assert memo.linear(x, w, bias, "silu", None) is None
    assert memo.linear(x, w, None, "gelu", None) is None
    assert memo.linear(x, w, bias, "gelu", residual) is None
    assert memo.linear(x, w.t().contiguous().t(), bias, "gelu", None) is None  # the weight stored K-major
    assert memo.linear(x, w, bias, "gelu", None) is not None


def test_what_the_memo_cannot_serve_is_never_filed_and_never_served(memo_type):
    x, w, bias, _ = _layer()
    memo = memo_type(8)

    class Subclass(torch.Tensor):  # (its __torch_function__ may compute otherwise)
        pass

    assert not memo.file(x.as_subclass(Subclass), w, bias, None, None)
    assert not memo.file(x, w, bias, "tanh", None)  # no activation of autogemm's
    assert not memo.file(x, w, bias, 3, None)
    assert not memo.file(x.numpy(), w, bias, None, None)
    assert not memo.file(x.to_sparse(), w, bias, None, None)
    assert len(memo) == 0
    memo.file(x, w, bias, None, None)
    assert memo.linear(x.as_subclass(Subclass), w, bias, None, None) is None
    assert memo.linear(x, w, bias, "tanh", None) is None
    assert memo.linear(x.numpy(), w, bias, None, None) is None


def test_matmul_keys_are_apart_from_linears_and_give_torch_matmuls_result(memo_type):
    x, w, _, _ = _layer()
    memo = memo_type(8)
    assert memo.matmul(x, w.T) is None
    assert memo.file_matmul(x, w.T)
    assert memo.linear(x, w.T, None, None, None) is None and memo.linear(x, w, None, None, None) is None
    assert torch.equal(memo.matmul(x, w.T), torch.matmul(x, w.T))
    assert memo.matmul(x, w.T.contiguous()) is None  # (other strides)
    assert memo.matmul(x.clone().requires_grad_(), w.T) is None
    assert not memo.file_matmul(x, w.T.numpy())


def test_a_parameter_is_a_tensor_to_it(memo_type):
    x, w, bias, _ = _layer()
    memo = memo_type(8)
    weight = torch.nn.Parameter(w, requires_grad=False)
    assert memo.file(x, weight, bias, "silu", None)
    assert torch.equal(memo.linear(x, weight, bias, "silu", None), F.silu(F.linear(x, w, bias)))


@pytest.mark.parametrize("which", ["x", "weight", "bias", "residual"])
def test_a_tensor_that_requires_grad_goes_the_python_way_which_refuses_it(memo_type, which):
    x, w, bias, residual = _layer()
    operands = {"x": x, "weight": w, "bias": bias, "residual": residual}
    operands[which] = operands[which].clone().requires_grad_()
    memo = memo_type(8)
    args = (operands["x"], operands["weight"], operands["bias"], "gelu", operands["residual"])
    assert memo.file(*args)
    assert memo.linear(*args) is None
    with torch.no_grad():  # (the Python path refuses it either way)
        assert memo.linear(*args) is None


def test_a_torch_function_mode_sees_the_python_way(memo_type):
    from torch.overrides import TorchFunctionMode

    seen = []

    class Watching(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x, w, bias, _ = _layer()
    memo = memo_type(8)
    memo.file(x, w, bias, None, None)
    with Watching():
        assert memo.linear(x, w, bias, None, None) is None
    assert memo.linear(x, w, bias, None, None) is not None


def test_a_full_memo_is_emptied_and_clear_empties_it(memo_type):
    memo = memo_type(2)
    layers = [_layer(m=(i + 1,)) for i in range(3)]
    for x, w, bias, _ in layers[:2]:
        memo.file(x, w, bias, None, None)
    assert len(memo) == 2
    x, w, bias, _ = layers[2]
    memo.file(x, w, bias, None, None)  # (the third: emptied first)
    assert len(memo) == 1 and memo.linear(*layers[0][:3], None, None) is None
    memo.clear()
    assert len(memo) == 0 and memo.linear(x, w, bias, None, None) is None


def test_the_dispatcher_empties_it_with_linears_other_memos(memo_type):
    x, w, bias, _ = _layer()
    dispatcher = Dispatcher()
    dispatcher.native_memo = memo = memo_type(8)
    memo.file(x, w, bias, None, None)
    dispatcher.clear()
    assert len(memo) == 0
    memo.file(x, w, bias, None, None)
    gemm = SimpleNamespace(fast_key=None, torch_keys=["gemm"], spare_bytes=0)
    dispatcher.torch_fast["gemm"] = gemm
    dispatcher._retire(gemm)  # (a GEMM's plan retired: the layers filed on it may be served otherwise now)
    assert len(memo) == 0
    memo.file(x, w, bias, None, None)
    newcomer = SimpleNamespace(fast_key="another", torch_keys=None)
    dispatcher.fast["another"] = newcomer
    dispatcher.torch_fast["gemm"] = gemm
    assert dispatcher.keep_torch("gemm", newcomer)  # replaced
    assert len(memo) == 0


class _Spy:
    """A memo that answers every call with `answer` and records what it was asked."""

    def __init__(self, answer):
        self.answer, self.asked = answer, []

    def linear(self, *args):
        self.asked.append(args)
        return self.answer

    def matmul(self, *args):
        self.asked.append(args)
        return self.answer

    def clear(self):
        pass


def test_linear_asks_the_memo_first_and_only_without_out_out_dtype_or_gate(monkeypatch):
    # (the C++ key has none of those: a call with one must never be served from it)
    x, w, bias, residual = _layer()
    dispatcher = Dispatcher()
    monkeypatch.setattr(dispatch, "_DISPATCHER", dispatcher)
    answer = object()
    dispatcher.native_memo = spy = _Spy(answer)
    assert dispatch.linear(x, w, bias, "gelu", residual=residual) is answer
    assert spy.asked == [(x, w, bias, "gelu", residual)]
    for keywords in ({"out_dtype": torch.float32}, {"out": torch.empty(3, 5, 12)}, {"gated": True}):
        dispatcher.native_memo = spy = _Spy(answer)
        try:
            dispatch.linear(x, w, bias, **keywords)
        except Exception:  # (the general path on CPU tensors: served, or refused, elsewhere)
            pass
        assert spy.asked == []


def test_the_switch_is_read_strictly(monkeypatch, caplog):
    monkeypatch.setenv(native_linear.SWITCH, "0")
    assert not native_linear.enabled() and native_linear.status() == "off"
    monkeypatch.setenv(native_linear.SWITCH, "1")
    assert native_linear.enabled()
    monkeypatch.setenv(native_linear.SWITCH, "yes")
    monkeypatch.setitem(native_linear._state, "status", "idle")
    with caplog.at_level(logging.ERROR, logger="autogemm.serving.native_linear"):
        assert not native_linear.enabled()
    assert "AUTOGEMM_NATIVE='yes'" in caplog.text


def test_a_failed_build_is_logged_once_and_leaves_the_python_way(monkeypatch, caplog):
    monkeypatch.setitem(native_linear._state, "status", "idle")
    monkeypatch.setattr(native_linear, "_waiting", [])

    def broken():
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(native_linear, "load", broken)
    dispatcher = Dispatcher()
    with caplog.at_level(logging.WARNING, logger="autogemm.serving.native_linear"):
        native_linear.attach(dispatcher)
        native_linear.build(wait=True, timeout=30)
    assert native_linear.status() == "failed" and dispatcher.native_memo is None
    assert "no compiler here" in caplog.text
    native_linear.attach(dispatcher)  # (not tried again)
    assert native_linear.status() == "failed"


def test_matmul_on_tensors_asks_the_memo_first_and_only_for_a_plain_product(monkeypatch):
    # (the C++ key has no alpha, compute or epilogue: a call with one must never be served from it)
    x, w, bias, _ = _layer(dtype=torch.bfloat16)
    dispatcher = Dispatcher()
    monkeypatch.setattr(dispatch, "_DISPATCHER", dispatcher)
    monkeypatch.setattr(dispatch, "_TENSOR", torch.Tensor)
    answer = object()
    dispatcher.native_memo = spy = _Spy(answer)
    assert dispatch.matmul(x, w.T) is answer
    assert len(spy.asked) == 1 and spy.asked[0][0] is x and spy.asked[0][1].data_ptr() == w.data_ptr()
    for keywords in ({"alpha": 2.0}, {"compute": "fp32"}, {"bias": bias}, {"beta": 1.0, "out": torch.empty(3, 5, 12)}):
        dispatcher.native_memo = spy = _Spy(answer)
        try:
            dispatch.matmul(x, w.T, **keywords)
        except Exception:  # (the general path on CPU tensors: served, or refused, elsewhere)
            pass
        assert spy.asked == []


def test_the_memo_takes_eager_layers_and_16_bit_residuals_cublaslt_adds_each_its_way():
    # (where a pass follows, the Python route's pass is faster on the GPU: a large layer gets F.linear and that
    # pass, a small one eager's calls; a residual that cuBLASLt reads as C, the same cuBLASLt call at any size)
    from autogemm.serving.eager_epilogue import TorchEagerEpiloguePlan
    from autogemm.serving.epilogue_step import TorchLtEpiloguePlan

    whole, with_pass = object.__new__(TorchEagerEpiloguePlan), object.__new__(TorchEagerEpiloguePlan)
    whole.finish, with_pass.finish = None, object()
    lt = object.__new__(TorchLtEpiloguePlan)
    rows = native_linear.MAX_OUTPUT_WITH_PASS // 256
    small, large = torch.empty(2, rows // 2, 8, dtype=torch.bfloat16), torch.empty(rows + 1, 8, dtype=torch.bfloat16)
    w = torch.empty(256, 8, dtype=torch.bfloat16)
    r_small, r_large = torch.empty(rows, 256, dtype=torch.bfloat16), torch.empty(rows + 1, 256, dtype=torch.bfloat16)
    route = native_linear.route
    assert route(whole, large, w, None, None) == native_linear.EAGER_CALLS
    assert route(with_pass, small, w, "silu", None) == native_linear.EAGER_CALLS
    assert route(with_pass, large, w, "silu", None) == native_linear.WITH_PASS
    one = torch.empty(1, 1, 8, dtype=torch.bfloat16)  # (one token: F.linear's three launches to the route's two)
    assert route(with_pass, one, w, "gelu", None) == native_linear.WITH_PASS
    assert route(whole, one, w, None, None) == native_linear.EAGER_CALLS
    assert route(lt, small, w, None, r_small) == route(lt, large, w, None, r_large) == native_linear.RESIDUAL_AS_C
    assert native_linear.residual_as_c(lt, large, w, None, r_large)
    assert not native_linear.residual_as_c(with_pass, small, w, None, r_small)
    assert route(lt, small, w, "gelu_tanh", None) is None  # (cuBLASLt's own GELU: not eager's calls)
    assert route(lt, small.float(), w.float(), None, r_small.float()) is None  # (eager's float32 may be TF32)
    assert route(object(), small, w, None, None) is None


def test_the_native_command_builds_the_memo_and_says_where(memo_type, capsys):
    from autogemm.cli import main

    assert main(["native"]) == 0
    assert native_linear.module_name() in capsys.readouterr().out
    assert main(["native", "--json"]) == 0
    assert '"status": "ready"' in capsys.readouterr().out


def test_the_native_command_says_why_it_cannot_build(monkeypatch, capsys):
    from autogemm.cli import main

    monkeypatch.setenv(native_linear.SWITCH, "0")
    assert main(["native"]) == 3
    assert "turned off (AUTOGEMM_NATIVE='0'" in capsys.readouterr().err
    monkeypatch.setenv(native_linear.SWITCH, "1")
    monkeypatch.setitem(native_linear._state, "status", "failed")
    monkeypatch.setitem(native_linear._state, "why", "no compiler here")
    assert main(["native", "--json"]) == 3
    captured = capsys.readouterr()
    assert "could not be built" in captured.err and "no compiler here" in captured.err
    assert '"exit_code": 3' in captured.out


def test_a_memo_built_earlier_in_the_process_is_not_given_once_the_switch_is_off(memo_type, monkeypatch):
    # (AUTOGEMM_NATIVE=0 after a build in the same process: the Python route serves, as the switch says)
    assert native_linear.build(wait=True)
    monkeypatch.setenv(native_linear.SWITCH, "0")
    dispatcher = Dispatcher()
    native_linear.attach(dispatcher)
    assert dispatcher.native_memo is None


def test_filing_takes_what_the_route_names_and_asks_for_the_memo_once(monkeypatch):
    from autogemm.serving.eager_epilogue import TorchEagerEpiloguePlan

    x, w, bias, _ = _layer(dtype=torch.bfloat16)
    whole = object.__new__(TorchEagerEpiloguePlan)
    whole.finish = None
    asked = []
    monkeypatch.setattr(native_linear, "attach", asked.append)
    dispatcher = Dispatcher()
    native_linear.file_linear(dispatcher, whole, x, w, bias, None, None)
    native_linear.file_matmul(dispatcher, x, w.T)
    assert asked == [dispatcher]  # (no memo yet: asked for, once)
    # asked, and none given (off, failed or building): a call's filing costs no more than that check
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native_linear, "residual_as_c", lambda *args: pytest.fail("weighed a call nothing will file"))
        native_linear.file_linear(dispatcher, whole, x, w, bias, None, None)

    class Recording:
        def __init__(self):
            self.filed = []

        def file(self, *args, **keywords):
            self.filed.append(("linear", *args, *keywords.items()))

        def file_matmul(self, *args):
            self.filed.append(("matmul", *args))

    dispatcher.native_memo = memo = Recording()
    native_linear.file_linear(dispatcher, whole, x, w, bias, None, None)
    native_linear.file_linear(dispatcher, object(), x, w, bias, None, None)  # (no plan the memo takes)
    native_linear.file_matmul(dispatcher, x, w)
    assert [entry[0] for entry in memo.filed] == ["linear", "matmul"]
    assert memo.filed[0][1:] == (x, w, bias, None, None, False) and asked == [dispatcher]
    from autogemm.serving.epilogue_step import TorchLtEpiloguePlan

    residual = torch.randn(*x.shape[:-1], w.shape[0], dtype=torch.bfloat16)
    native_linear.file_linear(dispatcher, object.__new__(TorchLtEpiloguePlan), x, w, None, None, residual)
    assert memo.filed[-1][1:] == (x, w, None, None, residual, True)  # (cuBLASLt's call, the residual as C)
    # a layer larger than eager's calls keep up with: the Python route's pass, as it describes itself (or nothing)
    with_pass = object.__new__(TorchEagerEpiloguePlan)
    with_pass.finish = SimpleNamespace(native_launch=lambda: ("the pass",))
    large = torch.empty(native_linear.MAX_OUTPUT_WITH_PASS // w.shape[0] + 1, w.shape[1], dtype=torch.bfloat16)
    native_linear.file_linear(dispatcher, with_pass, large, w, bias, "silu", None)
    assert memo.filed[-1][1:] == (large, w, bias, "silu", None, ("pass_launch", ("the pass",)))
    with_pass.finish = SimpleNamespace(native_launch=lambda: None)
    filed = len(memo.filed)
    native_linear.file_linear(dispatcher, with_pass, large, w, bias, "silu", None)
    assert len(memo.filed) == filed


def test_a_bias_key_off_the_gpu_holds_no_prepared_cublaslt_call_and_says_why(memo_type):
    """F.linear's cuBLASLt call is prepared for 16-bit operands on the GPU only; here the key runs at::linear."""
    x, w, bias, _ = _layer(dtype=torch.bfloat16)
    memo = memo_type(8)
    assert memo.file(x, w, bias, "gelu", None) and memo.file(x, w, None, None, None)
    assert len(memo) == 2 and memo.prepared() == 0
    assert "not a cuBLASLt call the memo prepares" in memo.unprepared_why()
    assert torch.equal(memo.linear(x, w, bias, "gelu", None), F.gelu(F.linear(x, w, bias)))


def test_a_residual_read_as_c_is_filed_only_with_its_cublaslt_call(memo_type):
    """A layer the Python route's cuBLASLt plan serves (the residual as C) has that call's arithmetic: the memo
    holds it only prepared, and no key stands in for it here, off the GPU; other keys are filed as before."""
    x, w, bias, residual = _layer(dtype=torch.bfloat16)
    memo = memo_type(8)
    assert not memo.file(x, w, None, None, residual, True) and len(memo) == 0
    assert "not a cuBLASLt call the memo prepares" in memo.unprepared_why()
    assert memo.linear(x, w, None, None, residual) is None
    assert not memo_type(8, prepare=False).file(x, w, bias, None, residual, residual_as_c=True)
    assert memo.file(x, w, None, None, residual)  # (eager's calls: at::linear, then the sum)
    assert torch.equal(memo.linear(x, w, None, None, residual), F.linear(x, w) + residual)


def _pass_launch(**changed):
    """A pass's launch as EpiloguePassInPlace.native_launch describes it (a CUfunction that is never launched)."""
    parts = dict(function=0x1234, grid=(4, 1, 1), block=(128, 1, 1), shared=0, bytes=bytes(48),
                 offsets=(0, 8, 16, 24, 32, 40), pointers=(0, 8, 16, 24, 32), alignment=16, device=0, keep=object())
    parts.update(changed)
    return tuple(parts.values())


@pytest.mark.parametrize("changed,named", [
    (dict(grid=(0, 1, 1)), "an empty grid or block"),
    (dict(bytes=bytes(44)), "arguments' bytes"),
    (dict(offsets=(0, 48)), "an argument's offset past its bytes"),
    (dict(pointers=(0, 8, 16, 24, 44)), "a pointer's offset not in its bytes"),
    (dict(pointers=(0, 8, 16, 24)), "the offsets of 5 pointers"),
    (dict(alignment=24), "no power of 2"),
    (dict(function=0), "no kernel"),
    (dict(grid="four"), "not a pass's launch"),
])
def test_a_pass_that_does_not_describe_a_launch_is_not_filed_and_says_why(memo_type, changed, named):
    x, w, bias, _ = _layer(dtype=torch.bfloat16)
    memo = memo_type(8)
    assert not memo.file(x, w, bias, "silu", None, pass_launch=_pass_launch(**changed))
    assert len(memo) == 0 and memo.passes() == 0
    assert named in memo.unprepared_why() and "not a pass's launch" in memo.unprepared_why()
    # (one that does is held where CUDA's driver is loaded; here it is not, and nothing is filed either)
    if not torch.cuda.is_available():
        assert not memo.file(x, w, bias, "silu", None, pass_launch=_pass_launch())
        assert "no cuLaunchKernel" in memo.unprepared_why()
    assert not memo_type(8, prepare=False).file(x, w, bias, "silu", None, pass_launch=_pass_launch())


def test_the_module_name_follows_the_header_the_source_includes(monkeypatch, tmp_path):
    """A change of a header the source includes, alone, is another build (the name keys the kept build)."""
    name = native_linear.module_name()
    header = tmp_path / native_linear.HEADERS[0].name
    header.write_text(native_linear.HEADERS[0].read_text() + "// another line\n")
    monkeypatch.setattr(native_linear, "HEADERS", (header,))
    assert native_linear.module_name() != name
