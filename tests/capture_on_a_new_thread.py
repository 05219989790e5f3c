"""A layer warmed up and then captured in a CUDA graph on a thread that has never run a PyTorch GEMM, in a
process of its own (a thread that ended leaves its cuBLAS handle in PyTorch's pool for a new one to take, so
only a fresh process shows a thread without one). The main thread files the layer's plan; a new thread's
calls are then served by autogemm's own prepared cuBLASLt call, and under the capture that call steps aside
for PyTorch's, which needs the thread's handle: `cublasCreate` fails inside a capture.

    python tests/capture_on_a_new_thread.py native   # linear's C++ memo (bias + SiLU + residual)
    python tests/capture_on_a_new_thread.py python   # the Python route's PreparedBiasLinear (AUTOGEMM_NATIVE=0)

prints the outcome last: "equal" (the replay gave eager's bits), "differs", or the error."""

from __future__ import annotations

import os
import subprocess
import sys
import threading


def outcome(route: str) -> str:
    """Runs the script in a fresh process; its last line."""
    env = dict(os.environ, **({"AUTOGEMM_NATIVE": "0"} if route == "python" else {}))
    done = subprocess.run([sys.executable, __file__, route], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _main(route: str) -> None:
    import torch

    import autogemm
    from autogemm.serving import dispatch, native_linear

    F = torch.nn.functional
    torch.manual_seed(0)
    x = torch.randn(24, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(192, 256, device="cuda", dtype=torch.bfloat16) / 16
    bias = torch.randn(192, device="cuda", dtype=torch.bfloat16)
    if route == "native":
        assert native_linear.build(wait=True, timeout=900), native_linear.status()
        residual = torch.randn(24, 192, device="cuda", dtype=torch.bfloat16)
        keywords = dict(activation="silu", residual=residual)
        expected = F.silu(F.linear(x, w, bias)) + residual
    else:
        keywords = {}
        expected = F.linear(x, w, bias)
    for _ in range(3):  # (this thread files the plan, and where the memo is built, the key)
        autogemm.linear(x, w, bias, **keywords)
    if route == "native":
        memo = dispatch._DISPATCHER.native_memo
        assert memo is not None and memo.prepared() == 1, memo and memo.unprepared_why()
    else:
        assert dispatch._DISPATCHER.native_memo is None
        plans = [p for key, p in dispatch._DISPATCHER.torch_epilogue.items() if key[0] == "linear"]
        assert plans and plans[0].prepared is not None, plans
    torch.cuda.synchronize()
    said = []

    def warm_up_then_capture():
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # (the prepared cuBLASLt call: no cuBLAS call of PyTorch's here)
                for _ in range(3):
                    autogemm.linear(x, w, bias, **keywords)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = autogemm.linear(x, w, bias, **keywords)
            graph.replay()
            torch.cuda.synchronize()
            said.append("equal" if torch.equal(y, expected) else "differs")
        except Exception as error:
            # (on one line: the outcome is the script's last line, and CUDA's errors span several)
            said.append(" ".join(f"{type(error).__name__}: {error}".split()))

    thread = threading.Thread(target=warm_up_then_capture)
    thread.start()
    thread.join()
    print(said[0])


if __name__ == "__main__":
    _main(sys.argv[1])
