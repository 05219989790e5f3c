"""Fault isolation on a GPU: a tune over deliberately broken variants (tests/broken_templates:
out-of-bounds write, infinite loop, oversized shared memory, wrong result, compile error) mixed
with good ones completes, records each failure with its kind and caches a good kernel; then
`autogemm cache verify` passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).parent


def _cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, AUTOGEMM_TEMPLATE_DIR=str(HERE / "broken_templates"))
    return subprocess.run([sys.executable, "-m", "autogemm.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


# each tile shape's variants (group_m) and what they should do. The small tile takes every fault:
# out-of-bounds (crash), hang (timeout), wrong and compile errors; its oversized-shared-memory variant
# (group_m 9) still fits and is valid. The big tile takes only what is its own: that variant's launch
# fails (its shared memory plus 48 KB exceed a block's), beside a valid one. (The faults are the template's
# by group_m whatever the tile: the big tile's crash, hang, wrong and compile variants repeated the small
# tile's, and its hang and crash alone cost two measuring-process restarts and 8 s.) One test a shape, so
# that two workers take them at once.
FAULTS = {"small": ([1, 3, 5, 6, 7, 9], {"crash": 1, "timeout": 1, "wrong": 1, "compile": 1}, 2, 2),
          "big": ([1, 9], {"launch": 1}, 1, None)}


# (each shape's seconds in the quick tier: the small tile waits out its hung candidate's 20 s)
@pytest.mark.parametrize("shape", [pytest.param("big", marks=pytest.mark.long(seconds=15)),
                                   pytest.param("small", marks=pytest.mark.long(seconds=53))])
def test_broken_variants_fail_with_their_kind_and_the_tune_survives(tmp_path, shape):
    group_m, failures, valid, restarts = FAULTS[shape]
    space = tmp_path / "broken_space.toml"
    text = (HERE / "data" / "broken_space.toml").read_text()
    assert 'shape = ["small", "big"]' in text and "group_m = [1, 3, 5, 6, 7, 9]" in text
    space.write_text(text.replace('shape = ["small", "big"]', f'shape = ["{shape}"]')
                     .replace("group_m = [1, 3, 5, 6, 7, 9]", f"group_m = {group_m}"))
    # 20 s a candidate: the GPU tier runs under pytest-xdist, where other workers share the GPU and the
    # cores; a valid candidate measured at 4 s came out as a timeout there, once more at 8 s, and at 12 s on a
    # freshly started machine (the tier took 180 s there against 138 warm)
    tune = _cli("tune", "--M", "512", "--space", str(space), "--sampler", "grid",
                "--trials", str(len(group_m)), "--timeout", "600", "--candidate-timeout", "20", "--storage",
                f"sqlite:///{tmp_path / 'studies.db'}", "--json")
    assert tune.returncode == 0, tune.stderr[-3000:]
    result = json.loads(tune.stdout)
    assert result["failures"] == failures, result["failures"]
    assert result["trials"]["valid"] == valid  # g1 (and for the small tile g9)
    if restarts is not None:
        assert result["restarts"] >= restarts  # after the crash and the timeout
    assert "_g1_" in result["config"] or "_g9_" in result["config"]
    assert result["rel_error"] <= 1e-5

    # every failure is on the study with its kind and message
    import optuna

    study = optuna.load_study(study_name=result["study"], storage=f"sqlite:///{tmp_path / 'studies.db'}")
    kinds = {t.user_attrs["config"]: t.user_attrs.get("failure") for t in study.trials
             if t.state == optuna.trial.TrialState.FAIL}
    assert len(kinds) == sum(failures.values()), kinds
    for name, kind in kinds.items():
        expected = {"_g3_": "crash", "_g5_": "timeout", "_g6_": "wrong", "_g7_": "compile", "_g9_": "launch"}
        assert any(tag in name and kind == want for tag, want in expected.items()), (name, kind)

    verify = _cli("cache", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "1/1 cached kernels verified" in verify.stdout


def test_cache_verify_drops_a_wrong_kernel(tmp_path):
    """A cached record whose kernel now computes wrong (here: the broken template behind its
    name) is dropped by `cache verify`."""
    from autogemm.results.cache import Record, TuningCache
    from autogemm.families import SimtConfig
    from autogemm.gpu.launch import current_device
    from autogemm.problem import Problem

    wrong = SimtConfig(64, 64, 8, 32, 32, 4, 8, 4, 4, 2, "pad", 6, 1)  # group_m 6: wrong result
    env_dir = os.environ.get("AUTOGEMM_TEMPLATE_DIR")
    os.environ["AUTOGEMM_TEMPLATE_DIR"] = str(HERE / "broken_templates")
    try:
        from autogemm.kernels.render import kernel_template_hash

        current_hash = kernel_template_hash(wrong.template)
    finally:
        if env_dir is None:
            os.environ.pop("AUTOGEMM_TEMPLATE_DIR")
        else:
            os.environ["AUTOGEMM_TEMPLATE_DIR"] = env_dir
    device = current_device()
    problem = Problem(256, 256, 256)
    record = Record(problem=problem.key, family="simt", config={k: v for k, v in wrong.to_dict().items() if k != "family"},
                    config_name=wrong.name, time_ms=1.0, tflops=1.0, cublas_ms=1.0, cublas_tflops=1.0, ratio=1.0,
                    rel_error=1e-7, template_hash=current_hash, device=device.name)
    TuningCache(shipped=False).store(record, device.slug)
    verify = _cli("cache", "verify")
    assert verify.returncode == 1
    assert "FAILED" in verify.stdout and "wrong" in verify.stdout and "dropped" in verify.stdout
    assert TuningCache(shipped=False).document(device.slug)["entries"] == {}
