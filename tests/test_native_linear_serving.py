"""How serving uses linear's memo in C++ (serving/native_linear.py): dispatch asks it first and only for the
calls its key holds, the switch AUTOGEMM_NATIVE is read strictly, a failed build is logged once and leaves the
Python route, `route` names what is filed and how, and `autogemm native` builds it or says why not. CPU only;
the memo itself: tests/test_native_linear.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from autogemm.serving import dispatch, native_linear  # noqa: E402
from autogemm.serving.planning import Dispatcher  # noqa: E402
from native_memo_cases import layer as _layer  # noqa: E402

pytestmark = pytest.mark.native


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
    whole.finish, with_pass.finish = None, SimpleNamespace(bias_left_by_tune=False)
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
    # (a small layer whose tune left the bias to the pass: eager's calls would put it back in F.linear)
    tuned = object.__new__(TorchEagerEpiloguePlan)
    tuned.finish = SimpleNamespace(bias_left_by_tune=True)
    assert route(tuned, small, w, "silu", None) == native_linear.WITH_PASS
    lt.rank = 0
    assert route(lt, small, w, None, r_small) == route(lt, large, w, None, r_large) == native_linear.LT_CALL
    assert native_linear.lt_call(lt, large, w, None, r_large)
    assert not native_linear.lt_call(with_pass, small, w, None, r_small)
    assert route(lt, small, w, "gelu_tanh", None) is None  # (cuBLASLt's own GELU: not eager's calls)
    assert route(lt, small.float(), w.float(), None, r_small.float()) is None  # (eager's float32 may be TF32)
    assert route(lt, small, w, None, None) is None  # (the heuristic's first with a bias alone: F.linear's own call)
    # the heuristic's runner-up that the layer's tune timed faster, with a bias alone or with a residual too
    ranked = object.__new__(TorchLtEpiloguePlan)
    ranked.rank = 2
    assert route(ranked, small, w, None, None) == route(ranked, large, w, None, r_large) == native_linear.LT_CALL
    assert route(ranked, small, w, None, r_small.half()) is None  # (a residual of another dtype)
    ranked.rank = -1  # (the GEMM alone's algorithm with the bias, which the layer's tune timed faster)
    assert route(ranked, small, w, None, None) == native_linear.LT_CALL
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
        patch.setattr(native_linear, "lt_call", lambda *args: pytest.fail("weighed a call nothing will file"))
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
    assert memo.filed[0][1:] == (x, w, bias, None, None) and asked == [dispatcher]
    from autogemm.serving.epilogue_step import TorchLtEpiloguePlan

    residual = torch.randn(*x.shape[:-1], w.shape[0], dtype=torch.bfloat16)
    lt = object.__new__(TorchLtEpiloguePlan)
    lt.rank = 0
    native_linear.file_linear(dispatcher, lt, x, w, None, None, residual)
    # (cuBLASLt's call, the residual as C, through the heuristic's first algorithm)
    assert memo.filed[-1][1:] == (x, w, None, None, residual, ("lt_call", True), ("lt_rank", 0))
    lt.rank = 3  # (a bias alone through the heuristic's fourth, which the layer's tune timed faster)
    native_linear.file_linear(dispatcher, lt, x, w, bias, None, None)
    assert memo.filed[-1][1:] == (x, w, bias, None, None, ("lt_call", True), ("lt_rank", 3))
    # a layer larger than eager's calls keep up with: the Python route's pass, as it describes itself (or nothing)
    with_pass = object.__new__(TorchEagerEpiloguePlan)
    with_pass.finish = SimpleNamespace(native_launch=lambda: ("the pass",), bias_in_linear=True)
    large = torch.empty(native_linear.MAX_OUTPUT_WITH_PASS // w.shape[0] + 1, w.shape[1], dtype=torch.bfloat16)
    native_linear.file_linear(dispatcher, with_pass, large, w, bias, "silu", None)
    # (and where the route hands the bias to F.linear, as eager's call does, the memo's key says so)
    assert memo.filed[-1][1:] == (large, w, bias, "silu", None, ("pass_launch", ("the pass",)),
                                  ("bias_in_linear", True))
    with_pass.finish = SimpleNamespace(native_launch=lambda: None, bias_in_linear=True)
    filed = len(memo.filed)
    native_linear.file_linear(dispatcher, with_pass, large, w, bias, "silu", None)
    assert len(memo.filed) == filed


def test_a_tuned_kernel_the_launcher_describes_is_filed_with_its_launch_and_nothing_else_is():
    """A layer whose tune with its epilogue kept a generated kernel (TorchFusedEpiloguePlan, `tuned`): the memo
    takes its launch where the launcher describes it (tma_launch's native_description: the plan adds the output's
    shape, the alignment the kernel assumes and the device), once; a kernel the bare GEMM's record chose (its
    guard decides, which the memo would not see), or one whose launcher cannot be described, is not filed."""
    from autogemm.serving.fused_epilogue import TorchFusedEpiloguePlan

    x, w, bias, _ = _layer(dtype=torch.bfloat16)
    described = []

    def launcher(*args):
        pytest.fail("the launcher launched")

    launcher.native_description = lambda: described.append(1) or ("the launch",)

    def plan(tuned: bool, launch=launcher) -> TorchFusedEpiloguePlan:
        made = object.__new__(TorchFusedEpiloguePlan)
        made.launch, made.tuned, made._native = launch, tuned, None
        made.outputs = SimpleNamespace(template=torch.empty(()).expand(*x.shape[:-1], w.shape[0]))
        made.alignment, made.device = (0, 8), 0
        return made

    tuned, chosen_by_the_bare_gemm = plan(True), plan(False)
    assert native_linear.route(tuned, x, w, "gelu", None) == native_linear.KERNEL
    assert tuned.native_launch() == ("the launch", (*x.shape[:-1], w.shape[0]), (0, 8), 0)
    assert native_linear.route(chosen_by_the_bare_gemm, x, w, "gelu", None) is None
    assert native_linear.route(plan(True, launch=lambda *args: None), x, w, "gelu", None) is None
    assert described == [1]  # (described once, the plan keeps it)

    class Recording:
        def __init__(self):
            self.filed = []

        def file(self, *args, **keywords):
            self.filed.append((*args, *keywords.items()))

    dispatcher = Dispatcher()
    dispatcher.native_memo = memo = Recording()
    native_linear.file_linear(dispatcher, tuned, x, w, bias, "gelu", None)
    native_linear.file_linear(dispatcher, chosen_by_the_bare_gemm, x, w, bias, "gelu", None)
    assert memo.filed == [(x, w, bias, "gelu", None, ("kernel_launch", tuned.native_launch()))]
