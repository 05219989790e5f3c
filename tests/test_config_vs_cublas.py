"""benchmarks/config_vs_cublas.py without a GPU: the problem and the configurations it is given, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent
bench = load_script(ROOT / "benchmarks" / "config_vs_cublas.py")


def test_configurations_are_read_by_name():
    name = "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts"
    (config,) = bench.configs_from([name])
    assert config.name == name and (config.bm, config.bn) == (128, 256)


@pytest.mark.parametrize("argv, message", [
    (["bfloat16:nt:64x64x64", "nonsense"], "'nonsense' is not a configuration name"),
    (["bfloat16:xx:64x64x64", "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts"], "is not a problem"),
    (["bfloat16:nt:64x64x64", "hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts", "--rounds", "0"], "--rounds"),
])
def test_what_does_not_read_is_refused_by_name(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
