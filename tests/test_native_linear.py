"""linear's memo in C++ (serving/native_linear.py, native_linear.cpp): built with the machine's compiler, it
serves a filed call with eager's own ATen calls and nothing else, gives None for everything it was not told
about, and is emptied with linear's other memos. CPU: torch's CPU tensors (what runs is ATen's, on any
device). Skipped without PyTorch, a C++ compiler or ninja; the build takes about half a minute. How serving
builds, asks and files it: tests/test_native_linear_serving.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from autogemm.serving import native_linear  # noqa: E402
from autogemm.serving.planning import Dispatcher  # noqa: E402
from native_memo_cases import layer as _layer  # noqa: E402

pytestmark = pytest.mark.native


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


def test_a_bias_key_off_the_gpu_holds_no_prepared_cublaslt_call_and_says_why(memo_type):
    """F.linear's cuBLASLt call is prepared for 16-bit operands on the GPU only; here the key runs at::linear."""
    x, w, bias, _ = _layer(dtype=torch.bfloat16)
    memo = memo_type(8)
    assert memo.file(x, w, bias, "gelu", None) and memo.file(x, w, None, None, None)
    assert len(memo) == 2 and memo.prepared() == 0
    assert "not a cuBLASLt call the memo prepares" in memo.unprepared_why()
    assert torch.equal(memo.linear(x, w, bias, "gelu", None), F.gelu(F.linear(x, w, bias)))


def test_a_residual_read_as_c_is_filed_only_with_its_cublaslt_call(memo_type):
    """A layer the Python route's cuBLASLt plan serves (the residual as C; or a bias through the heuristic's
    runner-up its tune chose) has that call's arithmetic: the memo holds it only prepared, and no key stands in
    for it here, off the GPU; other keys are filed as before."""
    x, w, bias, residual = _layer(dtype=torch.bfloat16)
    memo = memo_type(8)
    assert not memo.file(x, w, None, None, residual, True) and len(memo) == 0
    assert "not a cuBLASLt call the memo prepares" in memo.unprepared_why()
    assert memo.linear(x, w, None, None, residual) is None
    assert not memo_type(8, prepare=False).file(x, w, bias, None, residual, lt_call=True)
    assert not memo.file(x, w, bias, None, None, lt_call=True, lt_rank=2) and len(memo) == 0
    assert "not a cuBLASLt call the memo prepares" in memo.unprepared_why()
    assert not memo.file(x, w, bias, None, None, lt_call=True, lt_rank=8) and len(memo) == 0  # (past the ranks asked)
    assert "a rank of the heuristic's algorithms from 0 to 7" in memo.unprepared_why()
    assert not memo.file(x, w, bias, None, None, lt_call=True, lt_rank=-2) and len(memo) == 0
    assert "(or -1, the GEMM alone's)" in memo.unprepared_why()
    # the GEMM alone's algorithm (-1) passes the rank's check
    assert not memo.file(x, w, bias, None, None, lt_call=True, lt_rank=-1) and len(memo) == 0
    assert "not a cuBLASLt call the memo prepares" in memo.unprepared_why()  # (off the GPU, past the rank's check)
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
    (dict(pointers=(0, 8, 16, 24, 2**64 - 8)), "a pointer's offset not in its bytes"),  # (past 64 bits with its 8)
    (dict(pointers=(0, 8, 16, 24, 36)), "a pointer's offset off its 8-byte word"),
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


def _kernel_launch(**changed):
    """A tuned kernel's launch as TorchFusedEpiloguePlan.native_launch describes it (a CUfunction that is never
    launched; three 128-byte maps, then C, the bias, the residual, the C-mapped flag, alpha and beta)."""
    parts = dict(function=0x1234, grid=(132, 1, 1), block=(384, 1, 1), shared=200_000, bytes=bytes(432),
                 offsets=(0, 128, 256, 384, 392, 400, 408, 412, 416), maps=(0, 128, 256), pointers=(None, None),
                 c=384, bias=392, residual=400, c_mapped=408, alpha=412, beta=416, scalar_bytes=4, order=(0, 1),
                 encode=lambda role, address: bytes(128), keep=object(), output=(24, 192), alignment=(0, 0),
                 device=0)
    parts.update(changed)
    return tuple(parts.values())


@pytest.mark.parametrize("changed,named", [
    (dict(grid=(0, 1, 1)), "an empty grid or block"),
    (dict(bytes=bytes(436)), "arguments' bytes"),
    (dict(offsets=(0, 432)), "an argument's offset past its bytes"),
    (dict(maps=(0, 128, 320)), "a map's offset not in its bytes"),
    (dict(maps=(0, 128)), "the offsets of 3 maps and 2 pointers"),
    (dict(pointers=(384, None)), "A and B each as a map or as a pointer"),
    (dict(maps=(None, 128, 256)), "A and B each as a map or as a pointer"),
    (dict(c_mapped=None), "a C map with no flag"),
    (dict(residual=428), "the residual's offset not in its bytes"),
    (dict(residual=2**64 - 64), "the residual's offset not in its bytes"),  # (past 64 bits with its 8 bytes)
    (dict(scalar_bytes=2), "alpha and beta of 4 or 8 bytes"),
    (dict(order=(2, 0)), "x's role 0 or 1"),
    (dict(encode=None), "maps but no encoder of them"),
    (dict(alignment=(16, 0)), "no kernel, arguments, output or device"),
    (dict(output=()), "no kernel, arguments, output or device"),
    (dict(function=0), "no kernel"),
    (dict(device="one part fewer"), "a kernel's launch has 21 parts"),
])
def test_a_kernel_launch_that_describes_no_launch_is_not_filed_and_says_why(memo_type, changed, named):
    x, w, bias, _ = _layer(dtype=torch.bfloat16)
    launch = _kernel_launch(**changed)
    if changed.get("device") == "one part fewer":
        launch = launch[:-1]
    memo = memo_type(8)
    assert not memo.file(x, w, bias, "gelu", None, kernel_launch=launch)
    assert len(memo) == 0 and memo.kernels() == 0
    assert named in memo.unprepared_why() and "not a kernel's launch" in memo.unprepared_why()
    # (one that does is held where CUDA's driver is loaded; here it is not, and nothing is filed either)
    if not torch.cuda.is_available():
        assert not memo.file(x, w, bias, "gelu", None, kernel_launch=_kernel_launch())
        assert "no cuLaunchKernel" in memo.unprepared_why() and len(memo) == 0
        # (nor one whose A and B go as pointers: a kernel of another kind than Hopper's, with no maps)
        pointed = _kernel_launch(maps=(None, None, None), pointers=(0, 8), c_mapped=None, encode=None)
        assert not memo.file(x, w, bias, "gelu", None, kernel_launch=pointed)
        assert "no cuLaunchKernel" in memo.unprepared_why()
    assert not memo_type(8, prepare=False).file(x, w, bias, "gelu", None, kernel_launch=_kernel_launch())


def test_the_module_name_follows_the_header_the_source_includes(monkeypatch, tmp_path):
    """A change of a header the source includes, alone, is another build (the name keys the kept build)."""
    name = native_linear.module_name()
    header = tmp_path / native_linear.HEADERS[0].name
    header.write_text(native_linear.HEADERS[0].read_text() + "// another line\n")
    monkeypatch.setattr(native_linear, "HEADERS", (header,))
    assert native_linear.module_name() != name
