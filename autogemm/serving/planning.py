"""The per-process state behind `matmul`: the plan memo (bounded, least recently used first out) and
the coordination of threads and tunes. Many threads may call with a shape nobody planned yet: one
builds the plan, the others wait for it. Tunes asked for by `matmul` run one at a time per GPU in
this process and once per problem, and a tune of the same problem in another process is waited
for, never raced."""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from typing import Any

from .. import dtypes
from ..problem import Problem
from ..results.cache import TuningCache
from ..tuning.result import TuneError, TuneRunning
from . import race
from .guard import remember_loss
from .select import Choice, ChoiceSource, choose

# the budget of a tune `matmul(..., tune=True)` starts for a problem without a record
AUTOTUNE_TRIALS = 40
AUTOTUNE_TIMEOUT_S = 30.0
MAX_PLANS = 1024  # plans memoized per process (least recently used go first)
# the spare outputs the fast paths keep ready (torch_fast_path.SPARE_OUTPUT_BYTES), all plans together
SPARE_BUDGET_BYTES = 1024 * 1024 * 1024
# A call that finds another process tuning its problem waits this long for that tune's result,
# then serves the best it has without tuning, and plans again after PROVISIONAL_PLAN_S.
WAIT_FOR_TUNE_S = 2 * AUTOTUNE_TIMEOUT_S
PROVISIONAL_PLAN_S = 30.0


def fast_key(a: Any, b: Any, compute: Any, device: int) -> tuple[Any, ...]:
    """The key of `Dispatcher.fast` (matmul's fast path) of CuPy operands: what validation depended
    on. Dtypes by number: hashing a NumPy dtype costs more than the rest of the key together."""
    return a.shape, b.shape, a.strides, b.strides, a.dtype.num, b.dtype.num, compute, device


class Dispatcher:
    """Per-process state of `matmul`: the plan memo, the cache, and the coordination of threads.

    Many threads may call with a shape nobody planned yet: one builds the plan (cache lookup,
    compilation, a tune when asked for), the others wait for it. Tunes run one at a time per GPU
    in this process (concurrent tunes would time each other), and a tune of the same problem
    running in another process is waited for, not raced."""

    def __init__(self, cache: TuningCache = None):
        self.plans: OrderedDict = OrderedDict()  # full key (shapes, strides, dtype, ..., out) -> plan
        self.fast: dict[str, Any] = {}  # fast_key (CuPy operands, no out, alpha only) -> plan
        # key of the PyTorch fast path (the same, from torch's metadata: torch_fast_path.torch_fast_key) -> plan
        self.torch_fast: dict[str, Any] = {}
        # key of a call on tensors with an epilogue (epilogue_step.torch_epilogue_key) -> TorchEpiloguePlan
        self.torch_epilogue: dict[str, Any] = {}
        # linear's first memo: (weight's and bias's ids, x's metadata, keywords) -> linear_memo.Entry; emptied
        # whenever a torch_fast entry is retired or replaced, so that its plans' GEMMs are always current
        self.linear_by_weight: dict[tuple, Any] = {}
        # linear's memo in C++ of the layers eager's calls serve (native_linear.Memo, once built; None before):
        # emptied with linear_by_weight
        self.native_memo: Any = None
        self.native_asked = False  # whether native_linear was asked for the memo (once a process)
        # scaled_matmul's calls (scaled.ScaledCall) -> the tuned kernel's plan, or None (torch._scaled_mm serves)
        self.scaled: dict[str, Any] = {}
        self.grouped: dict[str, Any] = {}  # serving/grouped_plan.py's kernel plans
        self.lock = threading.Lock()
        self._building: dict[str, Any] = {}  # plan key -> Event set when the thread building it is done
        self._tune_locks: dict[int, threading.Lock] = {}  # GPU ordinal -> held while tuning on it
        self.races: dict[str, Any] = {}  # (device slug, problem key) -> race.RaceResult, for the process's life
        # (device slug, problem key) -> the online guard's verdict (guard.py), for the process's life
        self.verdicts: dict[str, Any] = {}
        self.spare_bytes = 0  # the plans' spare outputs (SPARE_BUDGET_BYTES)
        self._cache = cache

    @property
    def cache(self):
        """The cache given at construction, else the user's (its directory read on each use, so
        that $AUTOGEMM_CACHE_DIR set after import is honoured)."""
        if self._cache is not None:
            return self._cache
        return TuningCache()

    def clear(self) -> None:
        """Forgets every plan and race (after tuning, say, so that the next call looks at the cache
        again)."""
        with self.lock:
            self.plans.clear()
            self.fast.clear()
            self.torch_fast.clear()
            self.torch_epilogue.clear()
            self._forget_linear_memos()
            self.native_asked = False  # (a memo not given yet is asked for again)
            self.scaled.clear()
            self.grouped.clear()
            self.spare_bytes = 0
            self.races.clear()
            self.verdicts.clear()

    def plan_for(self, key: str, build: Any, fast_key: Any = None) -> Any:
        """The plan memoized under `key`, or the one `build()` makes: one thread builds it while
        the others asking for the same key wait (if it fails, each of them tries in turn)."""
        while True:
            plan = self.plans.get(key)
            if plan is not None and not plan.expired():
                try:
                    self.plans.move_to_end(key)
                except KeyError:  # evicted meanwhile by another thread: still good for this call
                    pass
                return plan
            with self.lock:
                pending = self._building.get(key)
                mine = pending is None
                if mine:
                    pending = self._building[key] = threading.Event()
            if not mine:
                pending.wait()
                continue
            try:
                plan = build()
                self._keep(key, plan, fast_key)
                return plan
            finally:
                with self.lock:
                    del self._building[key]
                pending.set()

    def _keep(self, key, plan, fast_key) -> None:
        with self.lock:
            old = self.plans.pop(key, None)
            if old is not None:
                self._retire(old)
            self.plans[key] = plan
            if fast_key is not None and plan.provisional_until is None:
                self.fast[fast_key] = plan
                plan.fast_key = fast_key
            while len(self.plans) > MAX_PLANS:
                _, evicted = self.plans.popitem(last=False)
                self._retire(evicted)

    def keep_torch(self, key: str, plan: Any) -> bool:
        """Serves tensors of PyTorch fast-path key `key` by `plan` (one the CuPy fast path serves the
        same operands with, seen through DLPack), while the plan stays memoized."""
        with self.lock:
            if plan.fast_key is None or self.fast.get(plan.fast_key) is not plan:  # retired meanwhile
                return False
            if self.torch_fast.get(key, plan) is not plan:  # another plan replaced: linear's memos may hold it
                self._forget_linear_memos()
            self.torch_fast[key] = plan
            if plan.torch_keys is None:
                plan.torch_keys = []
            if key not in plan.torch_keys:
                plan.torch_keys.append(key)
            return True

    def _forget_linear_memos(self) -> None:
        """Empties linear's memos (by the weight's identity, and the C++ one), whose entries are served
        without looking their GEMM's plan up."""
        self.linear_by_weight.clear()
        if self.native_memo is not None:
            self.native_memo.clear()

    def reserve_spare(self, nbytes: int) -> bool:
        """Whether a new plan may keep a spare output of `nbytes` (within the budget of all plans)."""
        with self.lock:
            if self.spare_bytes + nbytes > SPARE_BUDGET_BYTES:
                return False
            self.spare_bytes += nbytes
            return True

    def _retire(self, plan) -> None:
        """A plan replaced or evicted: its share of the spare-output budget back, its fast-path entry gone."""
        self.spare_bytes -= getattr(plan, "spare_bytes", 0)
        plan.spare_bytes = 0
        if plan.fast_key is not None and self.fast.get(plan.fast_key) is plan:
            del self.fast[plan.fast_key]
        for key in getattr(plan, "torch_keys", None) or ():
            if self.torch_fast.get(key) is plan:
                del self.torch_fast[key]
                self._forget_linear_memos()  # (their entries are served without looking at torch_fast)

    def with_verdict(self, choice: Choice, device: Any, problem: Problem) -> tuple[Choice, dict[str, Any] | None]:
        """A guarded choice as the online guard left it in this process, with its verdict (None: not
        decided yet, or not guarded): a kernel that lost gives way to cuBLAS."""
        verdict = self.verdicts.get((device.slug, problem.key)) if choice.guarded else None
        if verdict is None:
            return choice, None
        if verdict["kernel_won"]:
            choice.details["guard"] = verdict
            return choice, verdict
        lost = Choice(ChoiceSource.GUARD, None, f"{choice.source} {choice.config.name} lost to cuBLAS on this "
                      f"problem's first calls ({verdict['ratio']:.3f}x): cuBLAS", choice.record,
                      details=dict(choice.details, guard=verdict), ranked=choice.ranked)
        return lost, verdict

    def settle_guard(self, plan: Any, device: Any, problem: Problem) -> Any:
        """What the guard of `plan` does once it has decided (guard.Guard's `settle`): the winner
        serves the plan from the next call on; a kernel that lost is remembered (in the process, and
        in the user cache for the next processes, written from a thread so that no call waits for the
        file)."""
        config = plan.choice.config

        def settle(winner, verdict: dict[str, Any]) -> None:
            plan.launch = winner
            self.verdicts[(device.slug, problem.key)] = verdict
            plan.choice.details["guard"] = verdict
            if not verdict["kernel_won"]:
                threading.Thread(target=remember_loss, args=(self.cache, device, problem, config, verdict),
                                 name="autogemm-guard").start()

        return settle

    def race(self, problem: Problem, device: Any, choice: Choice, make_entrants: Any) -> Choice:
        """The choice a first-call race makes for `problem` (autogemm.serving.race), raced once per
        problem and process: `make_entrants()` gives (entrants, check) when it has not run yet.
        Threads planning the same key wait in plan_for; other keys of the same problem (other
        strides, alignments) find the memoized winner."""
        result = self.races.get((device.slug, problem.key))
        if result is None:
            entrants, check = make_entrants()
            result = self.races[(device.slug, problem.key)] = race.run_race(entrants, check)
        return race.race_choice(choice, result)

    # -- selection with side effects (cache reads, autotuning) --
    def select(self, problem: Problem, device: Any, tune: bool) -> Choice:
        slug = device.slug
        exact = self.cache.lookup(problem, slug)
        provisional = False
        if exact is None and tune and dtypes.find(problem.dtype, problem.compute) is not None:
            choice, provisional = self._tune(problem, device)
            if choice is not None:
                return choice
            exact = self.cache.lookup(problem, slug)
        records = [r for _, r in self.cache.records(slug) if not r.stale]
        choice = choose(problem, device, exact, records)
        choice.provisional = provisional
        return choice

    def _tune(self, problem: Problem, device) -> tuple[Choice | None, bool]:
        """Tunes `problem` (one tune at a time per GPU in this process; a thread that waited finds
        the result of the one before it in the cache). Returns (the tuned choice or None, whether a
        tune of it was still running elsewhere). A tune that fails is a warning, not an error:
        the call is served without it."""
        from ..tuning.tuner import tune as run_tune  # (lazy: Optuna)

        with self.lock:
            gpu_lock = self._tune_locks.setdefault(device.ordinal, threading.Lock())
        with gpu_lock:
            exact = self.cache.lookup(problem, device.slug)  # tuned by a thread that held the lock first
            if exact is not None:
                return choose(problem, device, exact, []), False
            try:
                result = run_tune(problem, trials=AUTOTUNE_TRIALS, timeout=AUTOTUNE_TIMEOUT_S, cache=self.cache)
            except TuneRunning as exc:  # another process tunes it: its result is worth waiting for
                from ..tuning.study import wait_for_study  # (lazy: Optuna)

                finished = wait_for_study(exc.study, WAIT_FOR_TUNE_S)
                return None, not finished
            except TuneError as exc:
                warnings.warn(f"autogemm: tuning {problem} failed ({exc}); served without tuning", stacklevel=4)
                return None, False
        exact = self.cache.lookup(problem, device.slug)
        if exact is None:  # tuned, but the cache could not keep it
            return None, False
        choice = choose(problem, device, exact, [])
        kept = f"cuBLAS kept, {result.kept_reason}" if result.kept_cublas else f"{result.ratio:.3f}x cuBLAS"
        choice.source, choice.reason = ChoiceSource.AUTOTUNE, f"tuned now ({result.valid} trials, {kept})"
        return choice, False
