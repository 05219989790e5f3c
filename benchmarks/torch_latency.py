"""What autogemm.matmul costs on PyTorch tensors (issue 37): host time per call and single-call
latency of autogemm on torch tensors (the torch fast path), beside autogemm on CuPy arrays of the
same memory, torch.matmul, and the general torch path (DLPack both ways, CuPy's stream set to
PyTorch's: what every call on tensors cost before the fast path). Problems cuBLAS serves (an empty
cache), so that autogemm and torch.matmul run the same kind of kernel.

Host time: wall-clock time of many calls in a row (synchronized every 100 calls) over their number,
on products small enough that the GPU keeps up with the host. Latency: autogemm.measure.timing.median_latency,
each call on an idle GPU between CUDA events (what comes before the launch counts).

    python benchmarks/torch_latency.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import os
import tempfile

# (benchmarks/ is the script's folder, first on sys.path)
from host_time import per_call_us

HOST_SHAPES = ((64, 64, 64), (256, 256, 256))
LATENCY_SHAPES = ((64, 64, 64), (256, 256, 256), (1, 4096, 4096), (1024, 1024, 1024))
DTYPES = ("float16", "float32")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    os.environ.setdefault("AUTOGEMM_CACHE_DIR", tempfile.mkdtemp(prefix="autogemm-torch-latency-"))
    import cupy
    import torch

    import autogemm
    import autogemm.results.cache
    from autogemm.serving import dispatch, torch_fast_path, torch_tensors
    from autogemm.measure.timing import median_latency

    autogemm.results.cache.shipped_cache_dir = lambda: None  # untuned: cuBLAS serves fp16 and fp32
    sync = torch.cuda.synchronize
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  cupy {cupy.__version__}  "
          f"raw stream query: {hasattr(torch._C, '_cuda_getCurrentRawStream')}", flush=True)

    def problem(m, n, k, dtype_name):
        dtype = getattr(torch, dtype_name)
        ta = (torch.rand(m, k, device="cuda") * 2 - 1).to(dtype)
        tb = (torch.rand(k, n, device="cuda") * 2 - 1).to(dtype)
        ca, cb = cupy.from_dlpack(ta), cupy.from_dlpack(tb)
        for _ in range(3):
            autogemm.matmul(ta, tb)
            autogemm.matmul(ca, cb)
        plan = dispatch._DISPATCHER.torch_fast.get(torch_fast_path.torch_fast_key(ta, tb, None))
        assert plan is not None, "the torch fast path has no plan"
        expected = ta.double() @ tb.double()
        error = (autogemm.matmul(ta, tb).double() - expected).abs().max() / expected.abs().max()
        assert float(error) < 1e-2, f"autogemm on torch: relative error {float(error):.3g}"
        return ta, tb, ca, cb, plan

    def competitors(ta, tb, ca, cb, plan):
        target = torch.empty(plan.shape, dtype=ta.dtype, device=ta.device)
        stream = next(iter(plan.torch_streams.values()))
        pa, pb, pc = ta.data_ptr(), tb.data_ptr(), target.data_ptr()
        return {
            "autogemm on torch (fast path)": lambda: autogemm.matmul(ta, tb),
            "  the plan's launch alone": lambda: plan.launch(pa, pb, pc, 1.0, 0.0, stream),
            "autogemm on CuPy": lambda: autogemm.matmul(ca, cb),
            "torch.matmul": lambda: torch.matmul(ta, tb),
        }

    def general_path(ta, tb):
        """torch_tensors.call as every call on tensors ran before the fast path (its registration of
        the plan for the fast path switched off)."""
        remember = dispatch.remember_torch

        def run():
            dispatch.remember_torch = lambda *args: False
            try:
                return torch_tensors.call(autogemm.matmul, ta, tb, None, alpha=1.0, beta=0.0, compute=None,
                                          tune=None, race=None)
            finally:
                dispatch.remember_torch = remember
        return run

    def host_pieces(ta, tb, plan):
        """The pieces of a fast-path call, each alone."""
        shape, dtype, device = plan.shape, ta.dtype, ta.device
        template = torch.empty((), dtype=dtype, device=device).expand(shape)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return {
            "  torch.empty(shape, dtype=, device=)": lambda: torch.empty(shape, dtype=dtype, device=device),
            "  tensor.new_empty(shape)": lambda: ta.new_empty(shape),
            "  torch.empty_like(expanded 0-d template) (the fast path's)": lambda: torch.empty_like(template),
            "  torch._C._cuda_getCurrentRawStream(0)": (lambda: raw(0)) if raw else (lambda: None),
            "  torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream(0).cuda_stream,
            "  torch._C._cuda_isCurrentStreamCapturing()": torch._C._cuda_isCurrentStreamCapturing,
            "  key + memo lookup":
                lambda: dispatch._DISPATCHER.torch_fast.get(torch_fast_path.torch_fast_key(ta, tb, None)),
        }

    print("\n== host time per call (us) ==", flush=True)
    for dtype_name in DTYPES:
        for m, n, k in HOST_SHAPES:
            ta, tb, ca, cb, plan = problem(m, n, k, dtype_name)
            pieces = dict(competitors(ta, tb, ca, cb, plan), **host_pieces(ta, tb, plan))
            pieces["general torch path (before)"] = general_path(ta, tb)
            print(f"-- {m}x{n}x{k} {dtype_name} (served by {plan.choice.source})", flush=True)
            for name, call in pieces.items():
                print(f"host {m}x{n}x{k} {dtype_name} {name:<58} {per_call_us(call, args.calls, sync):7.2f} us",
                      flush=True)

    print("\n== single-call latency (median, us) ==", flush=True)
    for dtype_name in DTYPES:
        for m, n, k in LATENCY_SHAPES:
            ta, tb, ca, cb, plan = problem(m, n, k, dtype_name)
            calls = competitors(ta, tb, ca, cb, plan)
            medians = median_latency(calls, rounds=args.rounds)
            # alone: a call that follows the general path's in the rotation ran 4-5 us slower
            medians.update(median_latency({"general torch path (before)": general_path(ta, tb)}, rounds=args.rounds))
            reference = medians["torch.matmul"]
            print(f"-- {m}x{n}x{k} {dtype_name} (served by {plan.choice.source})", flush=True)
            for name, ms in medians.items():
                print(f"latency {m}x{n}x{k} {dtype_name} {name:<34} {ms * 1e3:8.2f} us  "
                      f"({(ms - reference) * 1e3:+6.2f} vs torch.matmul)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
