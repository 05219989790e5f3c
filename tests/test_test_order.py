"""The test run's own order (tests/conftest.py): under pytest-xdist, each worker's first chunk of the queue
begins with its share of the long tests, so that no worker ends the run on several of them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import _first_chunks, _long_first, pytest_collection_modifyitems, pytest_configure_node


class _Item:
    def __init__(self, name, seconds=None):
        self.name, self.keywords = name, {}
        self._long = pytest.mark.long(seconds=seconds).mark if seconds is not None else None

    def get_closest_marker(self, name):
        return self._long if name == "long" else None

    def add_marker(self, marker):  # (the GPU and exhaustive skips, where they apply)
        self.keywords.setdefault("skips", []).append(marker)


def _items(tests=40):
    long = {3: 49, 9: 41, 17: 41, 22: 38, 30: 12, 35: 22}  # (position in the collection: seconds)
    return [_Item(f"t{i}", long.get(i)) for i in range(tests)]


def test_each_workers_first_chunk_begins_with_its_share_of_the_long_tests():
    items = _items()
    ordered = _long_first(items, 3)
    assert sorted(item.name for item in ordered) == sorted(item.name for item in items)  # (none lost, none twice)
    assert _first_chunks(len(items), 3) == [3, 3, 3]
    chunk = 3
    chunks = [ordered[i * chunk:(i + 1) * chunk] for i in range(3)]
    seconds = [sum(item.get_closest_marker("long").kwargs["seconds"] for item in c if item.get_closest_marker("long"))
               for c in chunks]
    # the longest first, each to the least loaded: 49 + 12, 41 + 38, 41 + 22 (in file order they would be
    # 49 + 41, 41 + 38, 12 + 22), a chunk's place left over taken by the next short test
    assert seconds == [61, 79, 63]
    assert [[item.name for item in c] for c in chunks] == [["t3", "t30", "t0"], ["t9", "t22", "t1"], ["t17", "t35", "t2"]]
    rest = [item.name for item in ordered if item.get_closest_marker("long") is None]
    assert rest == [item.name for item in items if item.get_closest_marker("long") is None]  # (their own order)


def test_under_work_stealing_each_workers_share_of_the_queue_begins_with_its_long_tests():
    """(`--dist worksteal`, as CI runs: each worker is first sent one run of consecutive tests, a share of the
    whole queue, and an idle worker takes the tail of another's)"""
    items = _items()
    assert _first_chunks(40, 3, "worksteal") == [13, 13, 14]  # (as xdist splits 40 among 3)
    ordered = _long_first(items, 3, "worksteal")
    assert sorted(item.name for item in ordered) == sorted(item.name for item in items)
    shares = [ordered[:13], ordered[13:26], ordered[26:]]
    longs = [[item.name for item in share if item.get_closest_marker("long")] for share in shares]
    assert longs == [["t3", "t30"], ["t9", "t22"], ["t17", "t35"]]  # (the loads as above: 61, 79, 63)
    assert all([item.name for item in share[:len(names)]] == names for share, names in zip(shares, longs))


def test_each_worker_is_told_the_runs_scheduling():
    """(a worker's own options say `dist = "no"`: pytest-xdist sets it so)"""
    node = SimpleNamespace(workerinput={"workercount": 2}, config=SimpleNamespace(getoption={"dist": "worksteal"}.get))
    pytest_configure_node(node)
    assert node.workerinput == {"workercount": 2, "dist": "worksteal"}


def test_one_process_runs_the_tests_in_their_collected_order():
    items = _items()
    assert _long_first(items, 1) == items
    collected = list(items)
    pytest_collection_modifyitems(SimpleNamespace(getoption=lambda name: True), collected)  # (no workerinput)
    assert [item.name for item in collected] == [item.name for item in items]
    worker = SimpleNamespace(getoption=lambda name: True, workerinput={"workercount": 3})
    pytest_collection_modifyitems(worker, collected)
    assert collected[0].name == "t3" and collected[3].name == "t9" and len(collected) == len(items)
    stealing = SimpleNamespace(getoption=lambda name: True, workerinput={"workercount": 3, "dist": "worksteal"})
    collected = list(items)
    pytest_collection_modifyitems(stealing, collected)
    assert collected[0].name == "t3" and collected[13].name == "t9" and len(collected) == len(items)


def test_the_long_marker_is_registered_and_marks_the_tunes():
    import pathlib

    assert '"long(seconds):' in (pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text()
    tuner = (pathlib.Path(__file__).parent / "test_gpu_tuner.py").read_text()
    assert "@pytest.mark.long(seconds=48)\ndef test_tune_caches_a_verified_kernel_and_resumes(" in tuner
