"""Where an untuned layer's call goes (issue 63): `autogemm.linear` with a bias or an activation on 16-bit
tensors, against eager PyTorch on the same tensors, split into its pieces. cuBLAS serves the GEMM (an
empty cache), so that autogemm and eager run the same GEMM: what separates them is the host's work a call.

The competitors of each layer:
- autogemm.linear, as a user calls it: its C++ memo where it is built (serving/native_linear.py), else
  the fast path (its plan found by linear's key);
- autogemm.linear, Python route: the same without the C++ memo;
- the plan's call alone: the plan linear's fast path finds, called directly (no key, no checks);
- the plan by identity: found by the weight's and bias's ids and x's metadata (the key linear_memo uses for
  the layers F.linear serves whole), then called: what a cheaper key would leave of the lookup's cost;
- the GEMM alone, `F.linear(x, w)`: the plan's own GEMM without the pass (not checked: no bias);
- eager: `F.linear(x, w, bias)`, then `F.gelu` or `F.silu`;
- eager as bench_epilogues writes it: `torch.matmul(x, w.T) + bias`, then the activation (one more kernel);
- eager behind linear's lookup: the same key built and looked up, then eager's calls, so that a difference
  from eager that this shares is the lookup's cost and one it does not share is the plan's.

And for the bare product of each layer (no bias): `autogemm.matmul(x, w.T)` against `torch.matmul(x, w.T)`,
which its torch fast path hands the call to (tuned_half measured 0.93-0.99x torch.matmul's latency there).

Host time: wall-clock time of many calls in a row (synchronized every 100 calls) over their number.
Latency: each call on an idle GPU between CUDA events (autogemm.measure.timing.latencies), the competitors
in an order drawn afresh each round (`mixed` below), and again each competitor alone (a call after
another's may pay for it).

    python benchmarks/linear_latency.py [--rounds 200] [--calls 2000]
    python benchmarks/linear_latency.py --layers float16:silu:1x14336x4096,bfloat16:gelu:128x14336x4096
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

# (benchmarks/ is the script's folder, first on sys.path)
from host_time import per_call_us

# (dtype, activation or None, M, N, K): the first layers of bench_unseen_epilogues' published draw
LAYERS = (("bfloat16", None, 1, 7168, 5120), ("float16", None, 200, 7168, 5120),
          ("bfloat16", "gelu", 77, 9216, 2304), ("float16", "gelu", 2048, 13824, 5120),
          ("bfloat16", "silu", 8, 9216, 3072))
ACTIVATIONS = ("bias", "gelu", "silu")  # "bias": the bias alone


def parse_layers(text: str) -> tuple[tuple, ...]:
    """Layers given as `dtype:activation:MxNxK` (activation bias, gelu or silu), comma-separated
    (ValueError naming the item that does not read so)."""
    layers = []
    for item in text.split(","):
        parts = item.strip().split(":")
        sizes = parts[2].split("x") if len(parts) == 3 else []
        if len(parts) != 3 or parts[0] not in ("float16", "bfloat16") or parts[1] not in ACTIVATIONS \
                or len(sizes) != 3 or not all(size.isdigit() and 0 < int(size) <= 1 << 20 for size in sizes):
            raise ValueError(f"{item!r} is not a layer: float16 or bfloat16, then bias, gelu or silu, then MxNxK "
                             f"(each from 1 to {1 << 20}), e.g. float16:silu:1x14336x4096")
        layers.append((parts[0], None if parts[1] == "bias" else parts[1], *map(int, sizes)))
    return tuple(layers)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="latency calls of each competitor (default 200)")
    parser.add_argument("--calls", type=int, default=2000, help="calls a host-time run makes (default 2000)")
    parser.add_argument("--layers", help="dtype:activation:MxNxK, comma-separated (activation bias, gelu or silu; "
                                         "default: the first layers of bench_unseen_epilogues' published draw)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 100:
        parser.error("--rounds must be at least 1 and --calls at least 100")
    try:
        layers = parse_layers(args.layers) if args.layers else LAYERS
    except ValueError as exc:
        parser.error(str(exc))
    os.environ.setdefault("AUTOGEMM_CACHE_DIR", tempfile.mkdtemp(prefix="autogemm-linear-latency-"))
    import torch
    import torch.nn.functional as F

    import autogemm
    import autogemm.results.cache
    from autogemm.measure.timing import latencies
    from autogemm.serving import dispatch, epilogue_step

    autogemm.results.cache.shipped_cache_dir = lambda: None  # untuned: cuBLAS serves the GEMM
    from autogemm.serving import native_linear

    native_linear.build(wait=True)  # (its status is printed below)
    sync = torch.cuda.synchronize
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  linear's C++ memo: {native_linear.status()}",
          flush=True)
    memo = dispatch._DISPATCHER.torch_epilogue

    for dtype_name, activation, m, n, k in layers:
        dtype = getattr(torch, dtype_name)
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=dtype)
        for _ in range(3):
            autogemm.linear(x, w, bias, activation=activation)
        key = epilogue_step.torch_linear_key(x, w, bias, None, activation, None, False)
        plan = memo.get(key)
        assert plan is not None, "linear's fast path has no plan"
        act = {None: None, "gelu": F.gelu, "silu": F.silu}[activation]

        def eager():
            y = F.linear(x, w, bias)
            return y if act is None else act(y)

        def eager_behind_the_lookup():  # (the plan checks the call itself, after F.linear's launch)
            found = memo.get(epilogue_step.torch_linear_key(x, w, bias, None, activation, None, False))
            if found is None:
                raise AssertionError("the plan went missing")
            return eager()

        wt = w.T
        bare = {"autogemm.matmul (no bias)": lambda: autogemm.matmul(x, wt),
                "torch.matmul (no bias)": lambda: torch.matmul(x, wt)}
        for _ in range(3):
            autogemm.matmul(x, wt)

        def eager_matmul_then_bias():
            y = torch.matmul(x, wt) + bias
            return y if act is None else act(y)

        # what a key of the operands' identity would cost in its place (x's metadata, the weight's and the
        # bias's ids): the lookup linear_memo makes for the layers F.linear serves whole, built inline as
        # dispatch.linear builds it (a call to linear_memo.key would add its own frame to the figure)
        by_identity = {(id(w), id(bias), x.shape, x.stride(), x.dtype, x.get_device(), activation): plan}

        def plan_by_identity():
            found = by_identity.get((id(w), id(bias), x.shape, x.stride(), x.dtype, x.get_device(), activation))
            return found.call(x, w, bias, None, 1.0)

        def python_route():  # autogemm.linear without its C++ memo
            native, dispatch._DISPATCHER.native_memo = dispatch._DISPATCHER.native_memo, None
            try:
                return autogemm.linear(x, w, bias, activation=activation)
            finally:
                dispatch._DISPATCHER.native_memo = native

        calls = {"autogemm.linear": lambda: autogemm.linear(x, w, bias, activation=activation),
                 "autogemm.linear, Python route": python_route,
                 "the plan's call alone": lambda: plan.call(x, w, bias, None, 1.0),
                 "the plan by identity": plan_by_identity,
                 "eager": eager, "eager behind linear's lookup": eager_behind_the_lookup,
                 "eager, matmul then + bias": eager_matmul_then_bias}
        expected = eager().double()
        for name, call in calls.items():
            error = float((call().double() - expected).abs().max() / expected.abs().max())
            assert error < 2e-2, f"{name}: relative error {error:.3g} against eager"
        calls["the GEMM alone, F.linear(x, w)"] = lambda: F.linear(x, w)  # (timed, not checked: no bias)
        label = f"{dtype_name} {activation or 'bias'} {m}x{n}x{k} ({type(plan).__name__})"
        print(f"-- {label}", flush=True)
        for group, reference_name in ((calls, "eager"), (bare, "torch.matmul (no bias)")):
            for name, call in group.items():
                print(f"host {name:<30} {per_call_us(call, args.calls, sync):8.2f} us", flush=True)
            mixed = latencies(group, rounds=args.rounds)
            reference = statistics.median(mixed[reference_name])
            for name, call in group.items():
                in_mix = statistics.median(mixed[name])
                alone = statistics.median(latencies({name: call}, rounds=args.rounds)[name])
                print(f"latency {name:<30} mixed    {in_mix * 1e3:8.2f} us ({(in_mix - reference) * 1e3:+6.2f} vs "
                      f"{reference_name})  alone {alone * 1e3:8.2f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
