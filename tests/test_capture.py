"""What a call under a CUDA graph capture gets, without a GPU (capture ids, allocations and the
stream query stood in for): each capture its own workspace per stream and purpose, the per-stream
pool left alone, and only the legacy stream's capture error turned into CaptureError."""

from __future__ import annotations

import pytest

from autogemm.gpu import capture
from autogemm.gpu.capture import CaptureError


@pytest.fixture
def captures(monkeypatch):
    """capture.memory with the capture id of each stream given by the test and allocations counted."""
    ids, made = {}, []

    def allocate(device, stream_pointer, nbytes, zeroed):
        made.append((device, stream_pointer, nbytes, zeroed))
        owner = _Owner(4096 * len(made), nbytes)
        return owner.ptr, owner

    monkeypatch.setattr(capture, "_capture_id", lambda stream_pointer: ids[stream_pointer])
    monkeypatch.setattr(capture, "_allocate", allocate)
    monkeypatch.setattr(capture, "_held", {})
    return ids, made


class _Owner:
    def __init__(self, ptr, size):
        self.ptr = ptr
        self.mem = type("Memory", (), {"size": size})()


def test_each_capture_gets_its_own_workspace_per_stream_and_purpose(captures):
    ids, made = captures
    ids.update({5: 1, 6: 1})
    first = capture.memory(0, 5, "cublas", 1000)
    assert capture.memory(0, 5, "cublas", 800) == first and len(made) == 1  # one capture's calls share it
    assert capture.memory(0, 6, "cublas", 800) != first  # a stream forked into the capture: its own
    assert capture.memory(0, 5, "split_k", 800) != first  # another purpose: its own
    assert capture.memory(0, 5, "cublas", 5000) != first and made[-1][2] == 5000  # grown
    ids[5] = 2  # the next capture on that stream: never the buffer an earlier graph holds
    held = capture.memory(0, 5, "cublas", 10)
    assert held not in {address for address in range(4096, 4096 * len(made), 4096)} and len(made) == 5


def test_a_zeroed_workspace_is_asked_for_zeroed(captures):
    ids, made = captures
    ids[7] = 3
    capture.memory(0, 7, "stream_k_counters", 64, zeroed=True)
    assert made == [(0, 7, 64, True)]


def test_the_per_stream_pool_hands_a_capture_to_capture_memory(monkeypatch):
    from autogemm.gpu import packed_launch
    from autogemm.gpu.packed_launch import WorkspacePool

    pool = WorkspacePool()
    monkeypatch.setattr(pool, "_allocate", lambda *args: pytest.fail("the stream's own pool allocated under a capture"))
    monkeypatch.setattr(packed_launch.capture, "capturing", lambda stream_pointer: True)
    asked = []
    monkeypatch.setattr(packed_launch.capture, "memory", lambda *args: asked.append(args) or 8192)
    assert pool.get(0, 5, "split_k", 1000, zeroed=False) == 8192
    assert asked == [(0, 5, "split_k", 1000, False)] and len(pool) == 0


def test_only_the_legacy_streams_capture_error_becomes_a_capture_error(monkeypatch):
    def implicit(stream_pointer):
        raise RuntimeError("cudaErrorStreamCaptureImplicit: operation would make the legacy stream depend on a "
                           "capturing blocking stream")

    monkeypatch.setattr(capture, "_stream_is_capturing", implicit)
    with pytest.raises(CaptureError, match="legacy default stream"):
        capture.capturing(0)

    def no_driver(stream_pointer):
        raise RuntimeError("cudaErrorInsufficientDriver")

    monkeypatch.setattr(capture, "_stream_is_capturing", no_driver)
    with pytest.raises(RuntimeError, match="InsufficientDriver") as raised:
        capture.capturing(0)
    assert not isinstance(raised.value, CaptureError)
    monkeypatch.setattr(capture, "_stream_is_capturing", lambda stream_pointer: 1)
    assert capture.capturing(5) is True


def test_the_warm_up_error_names_the_call_and_what_to_do():
    error = capture.require_plan("float32 (96, 80) @ (80, 72)")
    assert isinstance(error, CaptureError) and "(96, 80) @ (80, 72)" in str(error)
    assert "before capturing" in str(error) and "warm-up" in str(error)
