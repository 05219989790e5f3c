"""cuBLASLt's heuristic's runners-up as routes of a layer's tune (gpu/cublas_epilogue.py `lt_route`,
`measured_lt_rank`) and the torch route that serves the one its tune timed faster (serving/epilogue_step.py
`tuned_lt_rank`, register_torch), without a GPU: the routes' names, the choice beyond the noise, and the order in
which register_torch weighs the plans."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_eager_epilogue import _Cache  # (a user cache holding one record, its lookups recorded)

from autogemm.epilogue import Epilogue
from autogemm.gpu.cublas_epilogue import LT_BARE, LT_ROUTE, LT_RUNNERS_UP, lt_rank_name, lt_route, measured_lt_rank
from autogemm.gpu.eager_route import ROUTE, ROUTE_BIAS_IN_PASS
from autogemm.problem import Problem


def test_each_rank_is_a_route_of_its_own_and_the_first_keeps_its_name():
    from autogemm.measure.measuring import SERVED_LT

    assert lt_route(0) == LT_ROUTE == SERVED_LT  # (the records of earlier tunes name the first so)
    names = [lt_route(rank) for rank in range(LT_RUNNERS_UP + 1)]
    assert len(set(names)) == LT_RUNNERS_UP + 1 and lt_route(2) == "cublaslt epilogue #3"
    assert not {ROUTE, ROUTE_BIAS_IN_PASS} & set(names)
    # the GEMM alone's algorithm with the epilogue: a route of its own too, named apart from the ranks
    assert lt_route(LT_BARE) == "cublaslt epilogue (bare GEMM's algorithm)" and lt_route(LT_BARE) not in names
    assert (lt_rank_name(2), lt_rank_name(LT_BARE)) == ("#3", "(bare GEMM's algorithm)")


@pytest.mark.parametrize("baselines, rivals, rank", [
    ({}, (), 0),  # (no tune of the route: the heuristic's first)
    ({LT_ROUTE: 1.0}, (), 0),  # (a tune before the runners-up were timed)
    ({LT_ROUTE: 1.0, lt_route(1): 0.95}, (), 1),
    ({LT_ROUTE: 1.0, lt_route(1): 0.995}, (), 0),  # (within the noise)
    ({LT_ROUTE: 1.0, lt_route(1): 0.97, lt_route(3): 0.95}, (), 3),  # (the fastest, not the first to win)
    ({LT_ROUTE: 0.9, lt_route(1): 0.95}, (), 0),  # (the first is the fastest)
    ({lt_route(1): 0.9}, (), 0),  # (the first not timed: nothing to beat it against)
    # the routes that would serve the layer otherwise must be beaten too, those the tune timed
    ({LT_ROUTE: 1.0, lt_route(2): 0.95, ROUTE: 0.955}, (ROUTE, ROUTE_BIAS_IN_PASS), 0),
    ({LT_ROUTE: 1.0, lt_route(2): 0.95, ROUTE: 0.97}, (ROUTE, ROUTE_BIAS_IN_PASS), 2),
    ({LT_ROUTE: 1.0, lt_route(2): 0.95, ROUTE: 0.97, ROUTE_BIAS_IN_PASS: 0.9}, (ROUTE, ROUTE_BIAS_IN_PASS), 0),
    ({LT_ROUTE: 1.0, lt_route(2): 0.95, ROUTE: 0.9}, (), 2),  # (a route not named a rival does not count)
    # the GEMM alone's algorithm competes as a runner-up does
    ({LT_ROUTE: 1.0, lt_route(LT_BARE): 0.96, lt_route(1): 0.98}, (), LT_BARE),
    ({LT_ROUTE: 1.0, lt_route(LT_BARE): 0.995}, (), 0),  # (within the noise)
    ({LT_ROUTE: 1.0, lt_route(LT_BARE): 0.96, ROUTE: 0.965}, (ROUTE,), 0),
    ({LT_ROUTE: 1.0, lt_route(LT_BARE): 0.97, lt_route(2): 0.95}, (), 2),
])
def test_a_runner_up_serves_where_it_beat_the_first_and_the_rivals_beyond_the_noise(baselines, rivals, rank):
    assert measured_lt_rank(baselines, 0.01, rivals) == rank


def _record(baselines, is_cublas=True, stale=False):
    return SimpleNamespace(is_cublas=is_cublas, stale=stale, current_protocol=True, compiled_by_another_nvrtc="",
                           baselines=baselines)


FASTER_THIRD = {LT_ROUTE: 0.100, lt_route(2): 0.094, ROUTE: 0.101}
FASTER_BARE = {LT_ROUTE: 0.100, lt_route(LT_BARE): 0.095, lt_route(1): 0.099, ROUTE: 0.101}


@pytest.mark.parametrize("record, rank", [
    (None, 0),  # untuned
    (_record(FASTER_THIRD), 2),
    (_record(FASTER_BARE), LT_BARE),
    (_record(FASTER_THIRD, stale=True), 0),  # (its kernels' source changed since: not this tune's)
    (_record(FASTER_THIRD, is_cublas=False), 0),  # (a kernel kept: it takes the epilogue)
    (_record({**FASTER_THIRD, ROUTE_BIAS_IN_PASS: 0.090}), 0),  # (the torch route with the bias in the pass won)
])
def test_the_tuned_rank_is_the_layer_s_tune_s(record, rank):
    from autogemm.serving.epilogue_step import tuned_lt_rank

    problem = Problem(4096, 1024, 512, dtype="bfloat16", trans_b=True, epilogue=Epilogue("n"))
    dispatcher = SimpleNamespace(cache=_Cache(record))
    assert tuned_lt_rank(dispatcher, problem, SimpleNamespace(slug="a-gpu")) == rank
    assert dispatcher.cache.asked == [(problem, "a-gpu")]


@pytest.mark.parametrize("record, config, filed", [
    (_record(FASTER_THIRD), None, ("lt", 2)),  # the runner-up, before eager's F.linear
    (_record(FASTER_BARE), None, ("lt", LT_BARE)),  # the GEMM alone's algorithm with the bias, likewise
    (None, None, "eager"),  # untuned: eager's call, as before
    (_record({LT_ROUTE: 0.100, ROUTE: 0.101}), None, "eager"),
    (_record(FASTER_THIRD), "a kernel", "eager"),  # (a kernel serves the GEMM: no cuBLASLt route to rank)
])
def test_register_torch_files_the_runner_up_its_tune_timed_faster_before_eager_s_route(record, config, filed,
                                                                                     monkeypatch):
    torch = pytest.importorskip("torch")
    from autogemm.serving import epilogue_step

    monkeypatch.setattr(epilogue_step, "fused_plan", lambda *args: None)
    monkeypatch.setattr(epilogue_step, "eager_plan", lambda *args: "eager")
    monkeypatch.setattr(epilogue_step, "_lt_plan", lambda *args: ("lt", args[-1]) if len(args) == 13 else "lt")
    monkeypatch.setattr(epilogue_step, "device_info", lambda device: SimpleNamespace(slug="a-gpu"))
    files = []
    monkeypatch.setattr(epilogue_step, "file_plan", lambda dispatcher, key, plan: files.append(plan))
    x, w = torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    bias, product = torch.randn(8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)
    problem = Problem(4, 8, 16, dtype="bfloat16", trans_b=True)
    gemm = SimpleNamespace(problem=problem, choice=SimpleNamespace(config=config))
    dispatcher = SimpleNamespace(torch_fast={"gemm": gemm}, cache=_Cache(record))
    assert epilogue_step.register_torch(dispatcher, "key", "gemm", Epilogue("n"), (x, w.mT), product, product, bias,
                                        None)
    assert files == [filed]
    if config is None:  # (the record looked up is the layer's tune: the GEMM's problem with the epilogue)
        assert dispatcher.cache.asked == [(Problem(4, 8, 16, dtype="bfloat16", trans_b=True, epilogue=Epilogue("n")),
                                           "a-gpu")]


def test_the_gemm_alone_s_algorithm_is_told_apart_from_the_ranks_by_its_bytes():
    """A tune times the GEMM alone's algorithm with the epilogue only where it is none of the heuristic's ranks
    already timed (measuring.baseline_calls): the same algorithm would be one kernel timed under two names."""
    import numpy as np

    from autogemm.measure.epilogue_routes import same_algorithm

    def calls(*words):  # (each input set's call carries its algorithm, a heuristic result, as lt_calls' do)
        result = np.zeros(1, dtype=[("algo", "<u8", (8,)), ("workspace_size", "<u8")])
        result["algo"][0, :len(words)] = words
        call = lambda: None  # noqa: E731
        call.algorithm = result
        return [call, call]

    assert same_algorithm(calls(66, 3), calls(66, 3))
    assert not same_algorithm(calls(66, 3), calls(66, 4)) and not same_algorithm(calls(66), calls(67))
