"""Stand-ins for the measuring process, run in spawned processes by tests/test_isolate.py: they need
no GPU. A hung kernel is played by a process that never answers; what it started by a `sleep`."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def hang_with_a_child(conn, problem_key, ordinal, seed, parent_pid):
    """A measuring process that starts normally, then, asked to measure, starts a child process
    (its pid written to $AUTOGEMM_TEST_PIDFILE) and never answers, like a kernel that spins. Asked to
    stop instead, it stops."""
    from autogemm.measure.measuring_process import detach

    detach(parent_pid)
    conn.send(("ready", 1.0))
    if conn.recv()[0] == "stop":  # (the restarted one, at the evaluator's close: stops as a real one does)
        return
    child = subprocess.Popen(["sleep", "300"])
    with open(os.environ["AUTOGEMM_TEST_PIDFILE"], "a") as out:
        out.write(f"{os.getpid()} {child.pid}\n")
    while True:
        time.sleep(1)


class StandInMeasurer:
    """Answers like a GpuMeasurer without a GPU. Its cuBLAS time says who answered: the process id
    times 1000 plus the problem's M, so a test sees which process served which problem."""

    poisoned = ""

    def __init__(self, problem_key: str):
        from autogemm.problem import Problem

        problem = Problem.from_key(problem_key)
        self.cublas_ms = float(os.getpid() * 1000 + problem.m)
        self.slow = problem.n == 999  # a problem whose measurements take 3 s
        self.slow_baselines = problem.n == 998  # one whose baselines' timing takes 3 s
        self.baselines = {}

    def time_cublas(self, repeats=None):
        if self.slow_baselines:
            time.sleep(3)
        self.baselines = {"stand-in": self.cublas_ms}
        return self.cublas_ms

    def measure(self, config, best_ms, repeats, final):
        from autogemm.measure.evaluate import Measurement

        if self.slow:
            time.sleep(3)
        return Measurement(ok=True, time_ms=1.0, tflops=1.0, rel_error=0.0)


def serve_without_a_gpu(conn, problem_key, ordinal, seed, parent_pid):
    """The measuring process's life (measuring_process.serve_problems: one problem after another) with
    stand-in measurers."""
    from autogemm.measure.measuring_process import detach, serve_problems

    detach(parent_pid)
    serve_problems(conn, problem_key, seed, lambda key, seed: StandInMeasurer(key))


def follower(parent_pid, pidfile):
    from autogemm.measure.measuring_process import follow_parent

    follow_parent(parent_pid)
    with open(pidfile, "w") as out:
        out.write(str(os.getpid()))
    while True:  # busy, like a process waiting on the GPU
        sum(range(10_000))


def parent_of_a_follower(pidfile):
    """Runs as a script: starts a follower (spawned, like the measuring process), then waits to be
    killed."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ctx.Process(target=follower, args=(os.getpid(), pidfile), daemon=False).start()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    parent_of_a_follower(sys.argv[1])
