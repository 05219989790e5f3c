"""The quick GPU tier of the kernels: a hand-picked config for every family and instruction path
and every pipeline kind (single buffer, register double buffer, cp.async rings, split-K, stream-K,
register staging, an explicit register cap), each on every edge shape (1x1x1, primes, K = 1,
tails, batches with alpha/beta, misaligned views, two whole tiles) in layouts taken in turn,
against float64 with outputs poisoned with NaN. Every kernel is compiled ahead, in parallel.
The exhaustive samples are in test_gpu_samples.py (pytest --exhaustive)."""

from __future__ import annotations

import os

import pytest

from autogemm.families import config_from_name
from autogemm.problem import Device, Problem
from gpu_cases import EDGE_CASES, Run, execute, precompile, runs_for

QUICK = (
    # (dtype, compute, config)
    ("float32", "fp32", "128x128x8_w32x64_t8x8_v44_s1_pad_g8_k1_o1_sk"),  # single buffer, stream-K
    ("float32", "fp32", "128x256x8_w64x64_t8x16_v44_s2_swizzle_g8_k1_o1"),  # register double buffer, swizzle
    ("float32", "fp32", "128x128x16_w32x64_t8x8_v44_s3_pad_g8_k1_o1_r_sk"),  # ring, A staged in registers, stream-K
    ("float32", "fp32", "64x64x16_w32x32_t4x8_v44_s4_swizzle_g4_k4_o2"),  # 4-stage ring, split-K, 2 blocks per SM
    ("float32", "fp32", "16x32x8_w16x16_t2x4_v12_s2_plain_g1_k1_o4"),  # tiny tiles, scalar loads
    ("float32", "fp32", "64x128x16_w32x64_t8x8_v44_s3_pad_g8_k2_o1_r_reg196"),  # register cap 8 under the estimate
    ("float32", "fp32", "64x64x16_w32x32_t4x8_v44_s3_pad_g8_k2_o2_r_cr"),  # split-K over a cluster (sm_90)
    ("float32", "fp32", "32x64x8_w32x32_t8x4_v44_s2_swizzle_g8_k4_o2_fr"),  # split-K added up by the last block
    ("float16", "fp32", "wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o1"),
    ("float16", "fp32", "wmma_64x64x32_w32x32_v8_s2_pad_g8_k4_o1_mma"),
    ("float16", "fp32", "wmma_128x128x64_w128x64_v8_s4_pad_g8_k1_o1_wgmma"),
    ("bfloat16", "fp32", "wmma_32x64x32_w16x32_v8_s1_plain_g1_k1_o1"),
    ("bfloat16", "fp32", "wmma_64x64x32_w32x32_v8_s5_pad_g8_k1_o1_mma"),
    ("bfloat16", "fp32", "wmma_128x128x64_w128x64_v8_s3_pad_g8_k1_o1_wgmma"),
    ("float32", "tf32", "wmma_64x64x16_w32x32_v4_s3_pad_g8_k1_o1"),
    ("float32", "tf32", "wmma_64x64x16_w32x32_v4_s3_pad32_g8_k1_o1_mma"),
    ("float32", "tf32", "wmma_64x128x32_w64x128_v4_s5_pad_g8_k1_o1_wgmma"),
    ("float64", "fp64", "wmma_32x32x4_w16x16_v1_s3_pad_g8_k2_o1"),
    ("float64", "fp64", "wmma_32x32x8_w16x16_v2_s4_pad64_g8_k1_o1_mma"),
    # GEMV: B stored K x N (threads along N, rows of B in flight) and N x K (lanes along K, shuffles)
    ("float32", "fp32", "gemv_m4_n32_k64_w4_v4_u4_s1_o1"),
    ("float16", "fp32", "gemv_m4_n32_k64_w4_v4_u2_s2_o1"),  # split-K
    ("bfloat16", "fp32", "gemv_m4_n16_k128_w2_v4_u1_s1_o1"),
    ("float64", "fp64", "gemv_m4_n32_k64_w4_v2_u2_s3_o1"),  # split-K
    # misaligned operands copied to aligned pitches first, then a fused split-K
    ("float32", "fp32", "64x64x16_w32x32_t4x8_v44_s3_pad_g8_k2_o2_fr_pk"),
    # GEMV with the operands swapped (C^T = B^T A^T, C written transposed): without and with a split
    ("float32", "fp32", "gemv_m4_n32_k64_w4_v4_u4_s1_o1_sw"),
    ("float16", "fp32", "gemv_m4_n32_k64_w4_v4_u2_s2_o1_sw"),
    # Hopper: TMA into an mbarrier ring, wgmma from shared memory (misaligned operands are copied
    # first): two consumers on a persistent grid in clusters of two sharing B by multicast, storing
    # through TMA; one consumer, a block per tile, clusters of two, stores from registers; two
    # consumers taking turns on tiles of 128 rows (pingpong), persistent, storing through TMA
    ("float16", "fp32", "hopper_128x128x64_w64x128_s3_g8_k1_o1_p_c2_ts"),
    ("bfloat16", "fp32", "hopper_128x64x128_w128x64_s2_g1_k1_o1_c2"),
    ("bfloat16", "fp32", "hopper_256x128x64_w128x128_s3_g8_k1_o1_p_ts_pp"),
    # TF32 (operands rounded by TMA): swapped (NN, NT) with C stored transposed through TMA (from
    # registers where beta != 0 or C is misaligned); NT and TT with A's fragments from registers (TT),
    # storing through TMA; a 16-bit swap in every layout, two m64 blocks per consumer
    ("float32", "tf32", "hopper_128x128x32_w64x128_s4_g8_k1_o1_p_ts_sw"),
    ("float32", "tf32", "hopper_128x128x32_w64x128_s4_g1_k1_o1_ts"),
    ("float16", "fp32", "hopper_256x128x64_w128x128_s3_g8_k1_o1_p_ts_sw"),
    # K split over three work units per tile, the last to count adding them up: clusters of two, TMA store
    ("bfloat16", "fp32", "hopper_128x128x64_w64x128_s4_g8_k3_o1_p_c2_ts"),
    # the TMA store's chunks written by stmatrix: transposed (swap) and not, two m64 blocks a consumer
    ("bfloat16", "fp32", "hopper_128x128x64_w64x128_s5_g8_k1_o1_p_ts_sw_stm"),
    ("float16", "fp32", "hopper_256x128x64_w128x128_s3_g8_k1_o1_p_ts_stm"),
    # a slice's descriptors computed once (each wgmma's theirs plus a constant): two consumers in clusters of two
    # storing through TMA, two taking turns, TF32 with A's fragments from registers (B's descriptor alone)
    ("float16", "fp32", "hopper_128x128x64_w64x128_s4_g8_k1_o1_p_c2_ts_hd"),
    ("bfloat16", "fp32", "hopper_256x128x64_w128x128_s3_g8_k1_o1_p_ts_pp_hd"),
    ("float32", "tf32", "hopper_128x128x32_w64x128_s4_g1_k1_o1_ts_hd"),
    # clusters along N, the first block of a row multicasting A: pairs storing through TMA, and 2 x 2 clusters
    # (B multicast along M too) with K split in two, storing from registers
    ("bfloat16", "fp32", "hopper_128x128x64_w64x128_s4_g8_k1_o1_p_cn2_ts_hd"),
    ("float16", "fp32", "hopper_128x128x64_w64x128_s4_g8_k2_o1_p_c2_cn2_hd"),
    # stream-K: the tiles' K slices shared out over one block per SM (every edge shape has fewer tiles than
    # SMs, so that every tile is shared), storing through TMA; one consumer, 192 wide, from registers
    ("float16", "fp32", "hopper_128x128x64_w64x128_s4_g8_k1_o1_p_ts_sk"),
    ("bfloat16", "fp32", "hopper_64x192x64_w64x192_s5_g8_k1_o1_p_sk"),
    # tiles no multiple of 64 wide storing through TMA, the last 64-column chunk overlapping the one before:
    # two consumers of 64 x 160, and two taking turns on 128 x 96
    ("bfloat16", "fp32", "hopper_128x160x64_w64x160_s4_g8_k1_o1_p_ts_hd"),
    ("float16", "fp32", "hopper_256x96x64_w128x96_s4_g8_k1_o1_p_ts_pp_hd"),
    # ... and 168 wide (a step of 8) in clusters of two: the last chunk rewrites 24 of the columns before it
    ("bfloat16", "fp32", "hopper_128x168x64_w64x168_s5_g8_k1_o1_p_c2_ts_hd"),
    # ... from registers with K split in two: split-K's float4 slots hold 84 accumulators a thread
    ("float16", "fp32", "hopper_128x168x64_w64x168_s4_g8_k2_o1_p_hd"),
    # ... swapped (C^T = B^T A^T, the kernel's B is A, K-major), C stored through TMA in transposed pieces of 64 of
    # its rows, the last 64 overlapping the ones before, 168 wide (a step of 8) in clusters of two, K split in two
    # (the seeds offer swapped narrow tiles with split-K on short M; tests/test_gpu_epilogue.py runs one 176 wide
    # with an epilogue)
    ("bfloat16", "fp32", "hopper_128x168x64_w64x168_s5_g8_k2_o1_p_c2_ts_sw_hd"),
    # tiles wider than one wgmma (two of 256 and 64 columns a consumer, B in two boxes of 160 rows): two consumers
    # in clusters of two storing through TMA, and two taking turns on 64 x 320 tiles
    ("bfloat16", "fp32", "hopper_128x320x64_w64x320_s3_g8_k1_o1_p_c2_ts_hd"),
    ("float16", "fp32", "hopper_128x320x64_w64x320_s4_g8_k1_o1_p_ts_pp_hd"),
    # two consumers of 128 x 144 (144 accumulators a thread): in clusters of two storing through TMA (B K-major:
    # NT and TT), and swapped from registers on B stored K x N (NN: the kernel's 256 rows along N, cuBLAS's way)
    ("bfloat16", "fp32", "hopper_256x144x64_w128x144_s3_g8_k1_o1_p_c2_ts_hd"),
    ("float16", "fp32", "hopper_256x144x64_w128x144_s4_g8_k1_o1_p_c2_sw_hd"),
    # programmatic dependent launch: each launch may start while the one before drains, and waits before it
    # touches memory (the edge cases run back to back on one stream)
    ("float16", "fp32", "hopper_128x128x64_w64x128_s4_g8_k1_o1_p_c2_ts_hd_dl"),
)


# the Hopper stream-K configurations, by name (the tests that want them do not depend on where they sit in QUICK)
HOPPER_STREAM_K = [name for _, _, name in QUICK if name.startswith("hopper_") and name.endswith("_sk")]


def _device():
    from autogemm.gpu.launch import current_device

    return current_device()


def _runs(index: int, device):
    dtype, compute, name = QUICK[index]
    return runs_for(config_from_name(name), dtype, compute, device, offset=index)


def _compile_every_run(jobs: int | None = None) -> int:
    device = _device()
    return precompile([run for index in range(len(QUICK)) for run in _runs(index, device)], device, jobs)


_compiling: list = []  # the background compilation's Future, once started


def start_compiling_ahead() -> None:
    """Starts compiling every QUICK run's kernel in a background thread (conftest calls it as the session
    starts, where a test of this module will run): the worker that takes the precompile lock compiles while
    its own tests and the other workers' run, and the others' threads wait for the lock instead of their
    tests (which cost the tier about 19 s in each of three workers)."""
    if _compiling:
        return
    import threading
    from concurrent.futures import Future

    compiled: Future = Future()
    _compiling.append(compiled)

    # a core left to each pytest-xdist worker: the tests it overlaps (tunes, most of them) compile too
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    jobs = max(1, (os.cpu_count() or 2) - workers)

    def compile_all() -> None:
        try:
            compiled.set_result(_compile_every_run(jobs))
        except BaseException as exc:  # (kept for the fixture to raise)
            compiled.set_exception(exc)

    threading.Thread(target=compile_all, name="autogemm-test-precompile", daemon=True).start()


@pytest.fixture(scope="module")
def compiled_ahead():
    start_compiling_ahead()
    return _compiling[0].result()  # (a compile error is raised here, in the tests that need the kernels)


def test_the_tier_covers_every_path_layout_and_edge_shape():
    """(needs no GPU: the plan on sm_90, where every path exists)"""
    device = Device.for_arch("sm_90")
    ran: dict = {}
    for index in range(len(QUICK)):
        for run in _runs(index, device):
            path = (run.config.family, getattr(run.config, "instruction", "simt"), run.dtype, run.compute)
            ran.setdefault(path, set()).add((run.case.name, run.layout))
    # SIMT; WMMA, mma.sync and wgmma per 16-bit type and TF32; WMMA and mma.sync for FP64; GEMV per
    # dtype; Hopper per 16-bit type and TF32
    assert len(ran) == 19
    for path, done in ran.items():
        assert {case.name for case in EDGE_CASES} <= {name for name, _ in done}, path
        layouts = {layout for _, layout in done}
        k_major_only = path[1] == "wgmma" or (path[0] == "hopper" and path[3] == "tf32")  # no TN
        assert layouts == ({"nn", "nt", "tt"} if k_major_only else {"nn", "nt", "tn", "tt"}), path


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(len(QUICK)), ids=[f"{d}-{c}-{n}" for d, c, n in QUICK])
def test_config_matches_float64_on_every_edge_shape(index, compiled_ahead):
    dtype, compute, name = QUICK[index]
    device = _device()
    config = config_from_name(name)
    lacking = [r for r in config.check(Run(config, EDGE_CASES[2], "nt", dtype, compute).problem, device)
               if r.startswith(("tensor-core", "cluster"))]
    if lacking:
        pytest.skip(f"{device.name}: {lacking[0]}")
    runs = _runs(index, device)
    assert len(runs) == len(EDGE_CASES) + 1, f"{QUICK[index][2]} can run only {[str(r) for r in runs]}"
    for seed, run in enumerate(runs):
        execute(run, device, seed=100 * seed + index)


@pytest.mark.gpu
def test_stream_k_counters_are_reset_for_the_next_launch():
    """Stream-K blocks sharing a tile count themselves in per-tile counters that the finisher
    zeroes; launch after launch the result must stay right (primes: shares straddle tiles)."""
    from autogemm.measure.bench import random_uniform

    config = config_from_name(QUICK[2][2])
    a, b = random_uniform((331, 2039), seed=11), random_uniform((509, 2039), seed=12)
    c0 = random_uniform((331, 509), seed=13)
    _launched_three_times(config, a, b, c0, tolerance=1e-5)


def _launched_three_times(config, a, b, c0, tolerance):
    """C = A B^T + 0.5 C0 with `config`, launched three times on fresh copies of C0, each checked against
    float64 within `tolerance`: the results."""
    import cupy

    from autogemm.gpu.launch import bind
    from autogemm.measure.bench import reference_gemm, relative_error

    expected = reference_gemm(a, b, c0, trans_b=True, alpha=1.0, beta=0.5)
    results = []
    for launch in range(3):
        c = c0.copy()
        run, _ = bind(config, a, b, c, trans_b=True, beta=0.5)
        run()
        cupy.cuda.Device().synchronize()
        assert relative_error(c, expected) <= tolerance, f"launch {launch}"
        results.append(c)
    return results


@pytest.mark.gpu
@pytest.mark.parametrize("name", HOPPER_STREAM_K)
@pytest.mark.parametrize("m, n, k", [(1100, 3001, 520), (333, 2000, 3000)])
def test_hopper_stream_k_shares_a_partly_empty_wave_the_same_launch_after_launch(name, m, n, k):
    """Products whose last wave of tiles leaves SMs idle, shared out (templates/hopper_gemm.cu.j2,
    STREAM_K; families/stream_k.py): 1100 x 3001 x 520 FP16 NT takes a whole wave first (the 128 x 128
    config then shares the rest prefixes first, the 64 x 192 one takes a second wave along and shares
    tile after tile); 333 x 2000 x 3000 is less than one wave, shared prefixes first. The counters the
    finisher of a shared tile zeroes serve the next launch, and the slots are added up in run order:
    launch after launch the result is right and the same to the bit."""
    import cupy

    from autogemm.families.waves import fill
    from autogemm.measure.bench import random_uniform

    device = _device()
    config = config_from_name(name)
    problem = Problem.from_layout(m, n, k, "nt", dtype="float16")
    lacking = config.check(problem, device)
    if lacking:
        pytest.skip(f"{device.name}: {lacking[0]}")
    waves = fill(config, problem, device)
    assert waves.shared_tiles, waves.describe()
    a, b = random_uniform((m, k), "float16", seed=21), random_uniform((n, k), "float16", seed=22)
    c0 = random_uniform((m, n), "float16", seed=23)
    results = _launched_three_times(config, a, b, c0, tolerance=2e-3)
    assert all(bool(cupy.array_equal(results[0], c)) for c in results[1:])


@pytest.mark.gpu
# stream-K, split-K (SIMT; cluster; fused), split-K (GEMV; swapped), repacked operands with a fused split,
# split-K (Hopper), stream-K (Hopper), programmatic dependent launch (cuLaunchKernelEx through ctypes)
@pytest.mark.parametrize("index", [2, 3, 6, 7, 20, 23, 25, 32,
                                   next(i for i, (_, _, name) in enumerate(QUICK) if name == HOPPER_STREAM_K[0]),
                                   next(i for i, (_, _, name) in enumerate(QUICK) if name.endswith("_dl"))])
def test_one_launcher_serves_threads_on_their_own_streams(index):
    """A launcher's arguments are packed once and rewritten per call, and its workspaces come from a
    pool kept per stream: calls from several threads, each on its own stream with its own operands
    and alpha/beta, must all come out right, and the pool must not grow call after call."""
    import concurrent.futures

    import cupy

    from autogemm.measure.bench import random_uniform, reference_gemm, relative_error
    from autogemm.gpu.launch import launcher, prepare, resolve
    from autogemm.gpu.packed_launch import WORKSPACES

    dtype, _, name = QUICK[index]
    config = config_from_name(name)
    m, n, k = ((300, 7, 509) if config.swaps_operands else (7, 300, 509)) if config.family == "gemv" else (131, 257, 1031)
    operands = [(random_uniform((m, k), dtype, seed=3 * i), random_uniform((k, n), dtype, seed=3 * i + 1),
                 random_uniform((m, n), dtype, seed=3 * i + 2)) for i in range(4)]
    # made on the legacy default stream, which the non-blocking streams below do not wait for
    cupy.cuda.Device().synchronize()
    call = resolve(config, *operands[0])
    launch = launcher(prepare(config, call.problem, call.widths), call.a, call.b, call.c)  # shared by all threads
    tolerance = 1e-5 if dtype == "float32" else 2e-2

    def work(i, stream=None):
        a, b, c_in = operands[i % 4]
        alpha, beta = 1.0 + i % 3, 0.5 * (i % 2)
        with stream or cupy.cuda.Stream(non_blocking=True) as stream:
            errors = []
            for _ in range(5):
                out = c_in.copy()
                launch(a.data.ptr, b.data.ptr, out.data.ptr, alpha, beta, stream)
                stream.synchronize()
                errors.append(relative_error(out, reference_gemm(a, b, c_in, alpha=alpha, beta=beta)))
            return max(errors)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        errors = list(pool.map(work, range(12)))
    assert max(errors) <= tolerance, errors
    held, stream = len(WORKSPACES), cupy.cuda.Stream(non_blocking=True)
    for i in range(4):
        assert work(i, stream) <= tolerance
    purposes = 2 + (2 if config.repacks_operands else 0)  # partial sums and counters; copies of A and B
    assert len(WORKSPACES) <= held + purposes, "more than one workspace per stream and purpose"
