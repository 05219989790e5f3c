"""What serves a grouped call on PyTorch tensors (`serving/grouped.py`'s list, in order): the tuned grouped
kernel where this problem's records kept it (`tuned_grouped_config`, `KernelPlan`); else the faster baseline
the records measured (`recorded_baseline`); else torch._grouped_mm, or the loop where each expert fills the GPU
by itself (`serves_the_loop`). A record is of one routing bucket (`autogemm.routing`): the caller names the
bucket, or else every bucket's record must say the same. `kernel_plan` memoizes the answer per problem."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..families.hopper import TMA_ALIGN_BYTES
from ..gpu.grouped_launch import GROUPED_DTYPES, grouped_launcher, grouped_problem
from ..gpu.launch import device_info
from ..gpu.runtime import cupy_stream
from ..measure.grouped_measuring import LOOP, TORCH_GROUPED
from ..problem import Device, Problem
from ..routing import ROUTINGS
from .dispatch import dispatcher

MAX_PLANS = 256  # kernel plans kept (the memo is emptied when full; a dropped plan is made again)


@dataclass(frozen=True)
class GroupedCall:
    """A grouped call, checked: experts, rows (total_M, or max_M a expert when masked), K, N, the dtype, b's
    layout (True: K contiguous, the transpose of an (E, N, K) weight), bias, activation and the GPU."""

    experts: int
    rows: int
    k: int
    n: int
    dtype: str
    b_k_major: bool
    bias: bool
    activation: str
    masked: bool
    device: int


def tuned_grouped_config(lookup: Any, call: GroupedCall, routing: str | None, device: Device) -> Any:
    """The generated kernel's config that serves `call` on `device`, or None (torch serves). `lookup(problem)`
    is (record, source) of a problem's current record, or None. The routing bucket the caller names takes
    its record; with none named, both buckets' records must have kept the same kernel, since the call's
    routing cannot be seen on the host without a sync."""
    records = _bucket_records(lookup, call, routing)
    if records is None or any(record.is_cublas for _, record in records):
        return None
    chosen = {}
    for problem, record in records:
        config = record.config_object
        if config.check(problem, device):
            return None
        chosen[config.name] = (config, problem)
    return next(iter(chosen.values())) if len(chosen) == 1 else None


def recorded_baseline(lookup: Any, call: GroupedCall, routing: str | None) -> str | None:
    """LOOP or TORCH_GROUPED: the faster baseline of the records that kept it (the routing bucket the caller
    names, else both buckets', which must agree), or None where a record is missing or kept a kernel. A tune
    times both on its GPU (on Mixtral's skewed 4096 rows the loop beats torch._grouped_mm by 6%: a heuristic
    alone would serve the slower one)."""
    records = _bucket_records(lookup, call, routing)
    if records is None or not all(record.is_cublas for _, record in records):
        return None
    faster = set()
    for _, record in records:
        baselines = {name: ms for name, ms in record.baselines.items() if name in (LOOP, TORCH_GROUPED) and ms > 0}
        if not baselines:
            return None
        faster.add(min(baselines, key=baselines.get))
    return faster.pop() if len(faster) == 1 else None


def _bucket_records(lookup, call: GroupedCall, routing: str | None) -> list[Any] | None:
    """(problem, record) of the routing bucket the caller names, else of every bucket (the call's routing is
    not known on the host); None where a bucket has no record, or the call is none that grouped kernels serve."""
    if call.masked or call.dtype not in GROUPED_DTYPES or not call.rows:
        return None
    records = []
    for bucket in (routing,) if routing else ROUTINGS:
        problem = grouped_problem(call.rows, call.n, call.k, call.experts, call.dtype, call.b_k_major, bucket)
        found = lookup(problem)
        if found is None:
            return None
        records.append((problem, found[0]))
    return records


class KernelPlan:
    """A tuned grouped kernel, launched on every call with that call's addresses and stream."""

    def __init__(self, config: Any, problem: Problem, ordinal: int):
        self.config, self.problem = config, problem
        self.launch = grouped_launcher(config, problem, device_info(ordinal), ordinal)
        self.ordinal = ordinal
        self.streams: dict[str, Any] = {}  # PyTorch's stream handle -> its CuPy stream object (what the launcher takes)

    def run(self, torch: Any, a: Any, b: Any, offsets: Any, out: Any) -> bool:
        """Launches on the current stream; False (nothing launched) where the operands are not the dense,
        16-byte aligned arrays the kernel's tensor maps address."""
        dense_b = b.transpose(1, 2).is_contiguous() if self.problem.trans_b else b.is_contiguous()
        if not (a.is_contiguous() and dense_b and out.is_contiguous()) or \
                (a.data_ptr() | b.data_ptr() | out.data_ptr()) % TMA_ALIGN_BYTES:
            return False
        if offsets.dtype != torch.int32:
            offsets = offsets.to(torch.int32)  # (the kernel reads int32 offsets; a conversion on the GPU)
        pointer = torch.cuda.current_stream(a.device).cuda_stream
        stream = self.streams.get(pointer)
        if stream is None:
            stream = self.streams.setdefault(pointer, cupy_stream(pointer, self.ordinal))
        self.launch(a.data_ptr(), b.data_ptr(), offsets.data_ptr(), out.data_ptr(), stream)
        return True


def kernel_plan(call: GroupedCall, routing: str | None) -> Any:
    """The KernelPlan of `call` (and the routing its caller named); else the baseline its records kept
    (LOOP or TORCH_GROUPED, `recorded_baseline`), or None (no record says): from the process's Dispatcher,
    made on the first call of this problem (emptied by autogemm.reset())."""
    # (keyed by the product alone: the bias and activation run after the kernel, and a call with another one
    # finds the plan made, even inside a CUDA graph capture, where loading a module is not allowed)
    memo, key = dispatcher().grouped, (replace(call, bias=False, activation=""), routing)
    try:
        return memo[key]
    except KeyError:
        pass
    device = device_info(call.device)
    cache = dispatcher().cache
    def lookup(problem):
        return cache.lookup(problem, device.slug)

    tuned = tuned_grouped_config(lookup, call, routing, device)
    plan = KernelPlan(*tuned, call.device) if tuned is not None else recorded_baseline(lookup, call, routing)
    with dispatcher().lock:
        if len(memo) >= MAX_PLANS:
            memo.clear()
        return memo.setdefault(key, plan)


# the loop serves where each expert's product is this many waves of 128 x 128 tiles on its own (on the mean
# count): there cuBLAS per expert fills the GPU and one launch saves nothing (on an H100, Mixtral's 8 experts
# at 8192 rows each: the loop 1.06-1.08x torch._grouped_mm; at 512 rows, and 128 experts at 32-512 rows,
# torch._grouped_mm 1.03-5.4x the loop: benchmarks/results/grouped-*.md)
LOOP_WAVES = 4


def serves_the_loop(torch: Any, call: GroupedCall, plan: Any) -> bool:
    """Whether the loop over experts serves a call that `plan` (kernel_plan's) gives no kernel: where the records
    found it the faster baseline, or, with no record to say, where each expert's product fills the GPU by itself;
    never while the stream is being captured (the loop reads the offsets on the host, which a capture forbids)."""
    if isinstance(plan, KernelPlan) or plan == TORCH_GROUPED or torch.cuda.is_current_stream_capturing():
        return False
    if plan == LOOP:
        return True
    tiles = (call.rows / call.experts / 128) * (call.n / 128)
    sms = torch.cuda.get_device_properties(call.device).multi_processor_count
    return tiles >= LOOP_WAVES * sms
