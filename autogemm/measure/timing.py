"""The timing protocol: how every competitor (a generated kernel, cuBLASLt as `matmul` serves it,
cupy.matmul, torch.matmul) is timed, the same way for each (docs/decisions/timing-protocol.md).

Two figures:

- **GPU time** (`gpu_time`): what a call costs the GPU in steady state, with no host limit on any
  competitor. Each sample is a batch of back-to-back calls held behind a *gate*: a one-thread kernel
  that spins on the GPU's clock for longer than the host takes to enqueue the batch (measured), so
  that the GPU then runs the batch at its own pace whatever each call costs the host (cupy.matmul
  spends 15-45 us of host time a call; timed back to back without the gate, a 5 us product measured
  the host). A sample whose enqueueing outlasted its gate is discarded and the gate lengthened. Samples
  follow each other without a synchronization, so a long kernel keeps the GPU busy for the whole
  measurement (by default at least 100 ms of work, as in training or prefill, where clocks and power
  have settled; a tiny product stops at MAX_CALLS calls, where clocks do not matter). Unlike a CUDA
  graph, the gate times any library call, also the ones that refuse stream capture.
- **Latency** (`latencies`): what a user waits for, one call at a time, each starting on an idle GPU,
  its host time included; the competitors take turns in an order drawn afresh each round.

Both report medians. PROTOCOL is the version stored with every cached record: records of an older
protocol (host-bound baseline timings) are not evidence for the predictor.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..results.record import PROTOCOL  # noqa: F401 (the records' protocol version lives with them)

# GPU time: samples last about SAMPLE_MS of GPU time (at most MAX_BATCH calls); the measurement goes
# on until TARGET_MS of GPU time or MAX_CALLS calls, with at least MIN_SAMPLES valid samples.
TARGET_MS = 100.0
SAMPLE_MS = 2.0
MAX_BATCH = 200
MIN_SAMPLES = 5
MAX_CALLS = 3000
MAX_SAMPLES = 400
# the gate holds the GPU this much longer than the last enqueueing took, plus GATE_SLACK_S
GATE_FACTOR = 1.5
GATE_SLACK_S = 50e-6
# samples in flight before the host waits for the oldest (bounds the launch queue)
SAMPLES_IN_FLIGHT = 2
# launches queued behind gates at most: CUDA's queue of pending launches holds about a thousand, and a
# host that fills it waits for the gate to open, its sample discarded, the next gate longer, again and
# again (a loop of 128 launches a call ran past a tune's 10 s that way)
MAX_LAUNCHES_IN_FLIGHT = 768
# latency: calls of each competitor, after warm-up calls
LATENCY_CALLS = 25
# The least run-to-run spread assumed of a timing (H100 re-timings of one kernel differ by ~1%)
MIN_NOISE = 0.01

_GATE_SOURCE = r"""
extern "C" __global__ void autogemm_gate(unsigned long long hold_ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < hold_ns);
}
"""

_GATES: dict[int, object] = {}
_GATES_LOCK = threading.Lock()


def _gate():
    """The gate kernel of the current GPU (compiled once per process and GPU)."""
    import cupy  # (lazy: CuPy)

    device = cupy.cuda.Device().id
    with _GATES_LOCK:
        gate = _GATES.get(device)
        if gate is None:
            gate = _GATES[device] = cupy.RawKernel(_GATE_SOURCE, "autogemm_gate")
    return gate


@dataclass(frozen=True)
class GpuTime:
    """Milliseconds per call: the median over valid samples, their spread (half the interquartile
    range over the median), how many samples and calls, the GPU time measured in all, and the samples
    discarded because the host had not finished enqueueing when the gate opened."""

    median_ms: float
    spread: float
    samples: int
    calls: int
    total_ms: float
    discarded: int = 0

    @property
    def us(self) -> float:
        return self.median_ms * 1e3


def launch_limits(launches_per_call: int) -> tuple[int, int, int]:
    """(calls of the first gated batch, calls a sample at most, samples in flight) for calls of
    `launches_per_call` launches each, so that the launches queued behind gates stay within
    MAX_LAUNCHES_IN_FLIGHT (one launch a call: 8, MAX_BATCH and SAMPLES_IN_FLIGHT). ValueError where a
    single call needs more: such a call cannot be timed behind a gate."""
    if launches_per_call > MAX_LAUNCHES_IN_FLIGHT:
        raise ValueError(f"a call of {launches_per_call} launches cannot be timed behind the gate (CUDA queues about "
                         f"{MAX_LAUNCHES_IN_FLIGHT} while the gate holds the GPU)")
    in_flight = min(SAMPLES_IN_FLIGHT, MAX_LAUNCHES_IN_FLIGHT // launches_per_call - 1)
    per_sample = max(1, min(MAX_BATCH, MAX_LAUNCHES_IN_FLIGHT // (launches_per_call * (in_flight + 1))))
    return min(8, per_sample), per_sample, in_flight


def gpu_time(call: Any, *, target_ms: float = TARGET_MS, min_samples: int = MIN_SAMPLES, sample_ms: float = SAMPLE_MS,
             max_calls: int | None = None, stream: Any = None, launches_per_call: int = 1) -> GpuTime:
    """GPU time per call of `call(i)` (i counts calls; a caller rotating input sets uses it), which
    enqueues one call on `stream` (CuPy's current stream when None; a PyTorch call must be on the
    same stream). Batches of back-to-back calls behind the gate (module docstring). A call that launches
    several kernels says how many (`launches_per_call`): the batches are cut to CUDA's launch queue."""
    import cupy  # (lazy: CuPy)

    first_batch, max_batch, in_flight = launch_limits(launches_per_call)
    stream = stream or cupy.cuda.get_current_stream()
    max_calls = MAX_CALLS if max_calls is None else max_calls
    gate = _gate()
    with stream:
        count = 0
        for _ in range(2):  # warm: the first call may load a module or pick an algorithm
            call(count)
            count += 1
        stream.synchronize()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        began = time.perf_counter()
        start.record(stream)
        for _ in range(4):
            call(count)
            count += 1
        stop.record(stream)
        host_per_call = (time.perf_counter() - began) / 4
        stop.synchronize()
        per_call = cupy.cuda.get_elapsed_time(start, stop) / 4
        if per_call < 2 * host_per_call * 1e3:  # the host may have set the pace: ask the GPU behind the gate
            start, stop, _ = _gated_batch(call, count, first_batch, gate,
                                          GATE_FACTOR * first_batch * host_per_call + GATE_SLACK_S, stream)
            count += first_batch
            stop.synchronize()
            per_call = cupy.cuda.get_elapsed_time(start, stop) / first_batch
        per_call = max(per_call, 1e-4)
        batch = max(1, min(max_batch, math.ceil(sample_ms / per_call)))
        hold_s = GATE_FACTOR * batch * host_per_call + GATE_SLACK_S
        samples: list[float] = []
        pending: list[tuple[Any, ...]] = []
        total, discarded, calls = 0.0, 0, 0

        def take(sample) -> None:
            nonlocal total, discarded, hold_s
            start, stop, enqueue_s = sample
            stop.synchronize()
            if enqueue_s >= hold_s:  # the GPU may have waited for the host: not GPU time
                discarded += 1
                hold_s = GATE_FACTOR * enqueue_s + GATE_SLACK_S
                return
            elapsed = cupy.cuda.get_elapsed_time(start, stop)
            samples.append(elapsed / batch)
            total += elapsed

        while len(samples) + len(pending) + discarded < MAX_SAMPLES:
            pending.append(_gated_batch(call, count, batch, gate, hold_s, stream))
            count += batch
            calls += batch
            if len(pending) > in_flight:
                take(pending.pop(0))
                if len(samples) >= min_samples and (total >= target_ms or calls >= max_calls):
                    break
        for sample in pending:
            take(sample)
    if not samples:
        raise RuntimeError(f"no valid GPU-time sample in {discarded}: the host never got ahead of the GPU")
    median = statistics.median(samples)
    quartiles = np.percentile(samples, [25, 75])
    return GpuTime(median, float(quartiles[1] - quartiles[0]) / (2 * median), len(samples), len(samples) * batch,
                   total, discarded)


def _gated_batch(call, first: int, batch: int, gate, hold_s: float, stream) -> tuple[Any, ...]:
    """Enqueues the gate (holding the GPU `hold_s`), then `batch` calls between two events; returns
    (start, stop, seconds the host took to enqueue it all)."""
    import cupy  # (lazy: CuPy)

    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    began = time.perf_counter()
    gate((1,), (1,), (np.uint64(int(hold_s * 1e9)),), stream=stream)
    start.record(stream)
    for i in range(first, first + batch):
        call(i)
    stop.record(stream)
    return start, stop, time.perf_counter() - began


def latency_orders(names: list[str], rounds: int, seed: int | None = None) -> list[list[str]]:
    """The order of the competitors `names` in each of `rounds` latency rounds: a permutation drawn at
    random for each round (from `seed`; None: a fresh draw), so that every competitor follows every other
    about equally often. A rotating order (round r from the r-th name on) put each competitor after the
    same one in all but one round of every len(names), and a call's time can depend on what ran before it
    (a GEMM whose weight is larger than L2 finds part of it there or not). Measured on an H200, the random
    order moved bench_epilogues' latency from 1.027x to 1.028x eager: fairer, not a different verdict."""
    draw = random.Random(seed)
    return [draw.sample(names, len(names)) for _ in range(rounds)]


def latencies(calls: dict[str, Any], *, rounds: int = LATENCY_CALLS, warmup: int = 3,
              seed: int | None = None) -> dict[str, list[float]]:
    """Milliseconds of single calls of each zero-argument function in `calls` (name -> call), each
    call on an idle GPU: CUDA events around it on the current stream, the host waiting for it before
    the next. Within a round the competitors go in an order drawn at random (`latency_orders`, from
    `seed`), so that none is timed mostly after the same other one. The call's own host time
    (allocation, argument packing, the launch) is in its figure, as it is in a user's wait."""
    import cupy  # (lazy: CuPy)

    names = list(calls)
    stream = cupy.cuda.get_current_stream()
    for _ in range(warmup):
        for name in names:
            calls[name]()
    stream.synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    out: dict[str, list[float]] = {name: [] for name in names}
    for order in latency_orders(names, rounds, seed):
        for name in order:
            start.record(stream)
            calls[name]()
            stop.record(stream)
            stop.synchronize()
            out[name].append(cupy.cuda.get_elapsed_time(start, stop))
    return out


def median_latency(calls: dict[str, Any], **kwargs: Any) -> dict[str, float]:
    """`latencies`, each competitor's median."""
    return {name: statistics.median(values) for name, values in latencies(calls, **kwargs).items()}


# Sustained GPU time (`sustained_times`): what a training or prefill loop sees, the GPU never idle between
# calls, clocks and power settled at the device's limits. SUSTAINED_ROUNDS rounds of about
# SUSTAINED_ROUND_MS of GPU time per competitor (about a second each in all), each round's order drawn at
# random, after SUSTAINED_WARMUP_MS of the competitors in turn to bring the GPU to its steady state. At its
# power limit an H200's clocks swing over a few hundred ms: with rounds of 200 ms in an order that
# alternated (A B, B A, ...), two identical torch.matmul calls measured 3% apart, each always in the same
# phase of the swing. Short rounds in random order sample every phase for every competitor. The order is
# drawn afresh for each comparison: one seed for all made the same order every time, and a second torch.matmul
# under another name then measured 1.006x the first over eight problems (0.6% that each comparison of that many
# competitors inherits), against 1.001x with an order of its own for each problem.
# The warm-up outlasts the power limiter's first two clamps: from idle, an H200's clock drops to ~1320 MHz about
# 0.95 s into back-to-back GEMMs (calls up to 27% slower) and again ~1.9 s in, then swings by 3-4%; behind 300 ms
# and 1.5 s of warm-up those clamps fell in the timed rounds (decisions/timing-protocol.md has the measurements).
SUSTAINED_ROUNDS = 20
SUSTAINED_ROUND_MS = 50.0
SUSTAINED_WARMUP_MS = 2500.0
# The warm-up in ms instead (0 to MAX_WARMUP_MS): the test suite's GPU tier sets 300, as its tunes check what a
# tune does, not its figures, and a warm-up per sustained comparison cost the tier 37 s; decisions keep the default.
WARMUP_ENV = "AUTOGEMM_SUSTAINED_WARMUP_MS"
MAX_WARMUP_MS = 60_000.0
# Only products of at least this much GPU time a call are timed sustained: a shorter call's host time
# (cupy.matmul spends 15-45 us a call) could set the pace of back-to-back calls, and such a product's
# decisions are made on the gated GPU time and on latency.
SUSTAINED_FROM_MS = 0.05
# segments enqueued ahead of the host's wait for the oldest: the GPU always has the next ones queued
SUSTAINED_AHEAD = 4


def sustained_warmup_ms() -> float:
    """The sustained timings' warm-up, ms: SUSTAINED_WARMUP_MS, or what WARMUP_ENV says (ValueError where
    that is no number of milliseconds from 0 to MAX_WARMUP_MS)."""
    raw = os.environ.get(WARMUP_ENV)
    if raw is None:
        return SUSTAINED_WARMUP_MS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= MAX_WARMUP_MS:  # (NaN too)
        raise ValueError(f"{WARMUP_ENV}={raw!r}: a number of milliseconds from 0 to {MAX_WARMUP_MS:g} expected "
                         f"(unset: {SUSTAINED_WARMUP_MS:g})")
    return value


def sustained_times(calls: dict[str, Any], *, rounds: int = SUSTAINED_ROUNDS, round_ms: float = SUSTAINED_ROUND_MS,
                    warmup_ms: float | None = None, stream: Any = None,
                    seed: int | None = None) -> dict[str, list[float]]:
    """Milliseconds a call of each competitor (name -> `call(i)`, enqueuing one call on `stream`, CuPy's
    current stream when None), one figure a round: back-to-back calls with no synchronization between
    competitors or rounds, so that the GPU runs them as a loop of work does, never idle. Each round gives
    every competitor a segment of about `round_ms` of GPU time (calls counted from a first estimate),
    between two events, in an order drawn at random (from `seed`; None: a fresh draw), so that no competitor
    is always measured in one phase of the clocks' swings, nor always after the same others. For calls of at least SUSTAINED_FROM_MS, whose host time does not set
    the pace. The rounds follow `warmup_ms` of the competitors in turn (None: `sustained_warmup_ms()`)."""
    import cupy  # (lazy: CuPy)

    warmup_ms = sustained_warmup_ms() if warmup_ms is None else warmup_ms
    stream = stream or cupy.cuda.get_current_stream()
    names = list(calls)
    order = random.Random(seed)
    per_call: dict[str, float] = {}
    count = 0
    with stream:
        for name in names:  # a first estimate of each call's GPU time (after a warm call)
            calls[name](count)
            count += 1
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(3):
                calls[name](count)
                count += 1
            stop.record(stream)
            stop.synchronize()
            per_call[name] = max(cupy.cuda.get_elapsed_time(start, stop) / 3, 1e-3)
        segments: list[tuple[str, int, Any, Any]] = []
        pending: list[Any] = []

        def enqueue(name: str, target_ms: float) -> tuple[str, int, Any, Any]:
            nonlocal count
            calls_in_segment = max(1, math.ceil(target_ms / per_call[name]))
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(calls_in_segment):
                calls[name](count)
                count += 1
            stop.record(stream)
            pending.append(stop)
            while len(pending) > SUSTAINED_AHEAD:  # the host stays a few segments ahead, no more
                pending.pop(0).synchronize()
            return name, calls_in_segment, start, stop

        warmup_rounds = math.ceil(warmup_ms / (round_ms * len(names)))
        for r in range(warmup_rounds + rounds):
            for name in order.sample(names, len(names)):
                segment = enqueue(name, round_ms)
                if r >= warmup_rounds:
                    segments.append(segment)
        stream.synchronize()
    out: dict[str, list[float]] = {name: [] for name in names}
    for name, calls_in_segment, start, stop in segments:
        out[name].append(cupy.cuda.get_elapsed_time(start, stop) / calls_in_segment)
    return out


@dataclass
class Sustained:
    """Sustained GPU time (timing.sustained_times) of finalists and baselines: ms a call in each round,
    per config (in the order given) and per baseline, and the SM clock (MHz) and board power (W) seen
    during the rounds (0: NVML gave none). A competitor's figure is the mean of its rounds: what a loop of
    its calls costs over the clocks' swings (a median of rounds that fall in two phases picks one phase).
    A round's figures were taken side by side: the noise of a comparison is that of the rounds' paired
    ratios, not of each competitor's drift."""

    kernel_rounds: list[list[float]]
    baseline_rounds: dict[str, list[float]]
    sm_clock_mhz: float = 0.0
    power_w: float = 0.0

    @property
    def kernel_ms(self) -> list[float]:
        return [statistics.fmean(rounds) for rounds in self.kernel_rounds]

    @property
    def fastest(self) -> int:
        """The index of the config with the least mean."""
        means = self.kernel_ms
        return min(range(len(means)), key=means.__getitem__)

    @property
    def baselines(self) -> dict[str, float]:
        return {name: statistics.fmean(rounds) for name, rounds in self.baseline_rounds.items()}

    @property
    def faster_baseline(self) -> str:
        means = self.baselines
        return min(means, key=means.__getitem__)

    @property
    def baseline_ms(self) -> float:
        """The faster baseline's."""
        return self.baselines[self.faster_baseline]

    @property
    def rounds(self) -> int:
        return len(self.baseline_rounds[self.faster_baseline])

    def noise(self, index: int) -> float:
        """How far config `index`'s ratio to the faster baseline may be off: twice the standard error of
        the mean of its paired ratios (the baseline's time over the config's, round by round), over that
        mean, at least MIN_NOISE. The config must beat the baseline by more to count as faster."""
        ratios = [base / kernel for base, kernel in zip(self.baseline_rounds[self.faster_baseline],
                                                        self.kernel_rounds[index])]
        if len(ratios) < 2:
            return MIN_NOISE
        error = statistics.stdev(ratios) / math.sqrt(len(ratios))
        return max(MIN_NOISE, 2 * error / statistics.fmean(ratios))

    def pooled(self, index: int, more: Sustained) -> Sustained | None:
        """Config `index`'s rounds and the baselines' followed by `more`'s (a timing of that config alone with
        the same baselines), each round still paired with its own baselines'; None where `more` has other
        baselines or no config. The clocks and power: the mean of the readings each timing had."""
        if set(more.baseline_rounds) != set(self.baseline_rounds) or len(more.kernel_rounds) != 1:
            return None
        clocks = [x for x in (self.sm_clock_mhz, more.sm_clock_mhz) if x]
        power = [x for x in (self.power_w, more.power_w) if x]
        return Sustained(kernel_rounds=[self.kernel_rounds[index] + more.kernel_rounds[0]],
                         baseline_rounds={name: rounds + more.baseline_rounds[name]
                                          for name, rounds in self.baseline_rounds.items()},
                         sm_clock_mhz=statistics.fmean(clocks) if clocks else 0.0,
                         power_w=round(statistics.fmean(power), 1) if power else 0.0)
