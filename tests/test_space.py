from __future__ import annotations

import pytest

from autogemm.problem import Device, Problem
from autogemm.space import SearchSpace, SpaceError

SM90 = Device.for_arch("sm_90")
SQUARE = Problem(4096, 4096, 4096)


def test_shipped_space_loads_and_fills_every_config_field():
    space = SearchSpace.load()
    assert space.family == "simt"
    assert set(space.config_class.__dataclass_fields__) <= set(space.knobs) | set(space.derived)
    assert space.knobs["stages"] == (1, 2, 3, 4)


def test_knobs_that_feed_nothing_are_reported(tmp_path):
    text = SearchSpace.load().path.read_text().replace("[knobs]\n", "[knobs]\ncolour = [1, 2]\n", 1)
    path = tmp_path / "space.toml"
    path.write_text(text)
    with pytest.raises(SpaceError, match="unknown knobs colour: neither a simt config field"):
        SearchSpace.load(path)


def test_evaluate_names_the_broken_constraints():
    space = SearchSpace.load()
    values = {k: v[0] for k, v in space.knobs.items()}  # tm = tn = 1, one lane row: a 1x32 warp tile
    config, broken = space.evaluate(values)
    assert config is None
    assert any("outputs_per_thread" in rule for rule in broken)


def test_sample_is_reproducible_valid_and_distinct():
    space = SearchSpace.load()
    first = space.sample(50, SQUARE, SM90, seed=3)
    assert first == space.sample(50, SQUARE, SM90, seed=3)
    assert first != space.sample(50, SQUARE, SM90, seed=4)
    assert len({c.name for c in first}) == 50
    for config in first:
        assert space.contains(config)
        assert config.check(SQUARE, SM90) == []


def test_sample_respects_the_problem():
    # K = 16 has two K tiles of BK = 8 and one of BK = 16: large split-K values must not appear
    space = SearchSpace.load()
    problem = Problem(512, 512, 16)
    for config in space.sample(100, problem, SM90, seed=1):
        assert config.split_k <= -(-16 // config.bk)


def test_small_space_is_enumerated(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(
        'family = "simt"\n[knobs]\n'
        "bm = [128]\nbn = [128]\nbk = [8, 16]\nwm = [32]\nwn = [64]\ntm = [8]\ntn = [8]\n"
        'vec = [4]\nvec_frag = [4]\nstages = [2]\nsmem = ["pad", "swizzle"]\ngroup_m = [8]\nsplit_k = [1]\nmin_blocks = [1]\ntranspose = ["async"]\nstream_k = [false]\nmax_registers = [0]\n'
        '[constraints]\nrules = ["bk >= 8"]\n'
    )
    space = SearchSpace.load(path)
    assert len(space.all_configs) == 4
    assert len(space.sample(10, SQUARE, SM90)) == 4


@pytest.mark.parametrize(
    "body,message",
    [
        ('family = "simd"\n', "family must be one of simt"),
        ('family = "simt"\n[knobs]\ncolour = [1]\n', "config fields neither searched nor derived: bm"),
        ('family = "simt"\n[knobs]\nbm = []\n', "knob bm needs a non-empty list of choices"),
        ("family = simt", "not valid TOML"),
    ],
)
def test_bad_space_files_are_named(tmp_path, body, message):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(SpaceError, match=message) as info:
        SearchSpace.load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "rule,message",
    [
        ("__import__('os').system('true')", "only min\\(\\) and max\\(\\) may be called"),
        ("bm.real > 0", "Attribute is not allowed"),
        ("bogus > 1", "unknown names bogus"),
        ("bm >", "cannot parse"),
    ],
)
def test_constraints_are_a_closed_expression_language(tmp_path, rule, message):
    shipped = SearchSpace.load().path.read_text()
    text = shipped.replace('rules = [', f'rules = [\n    "{rule}",', 1)
    path = tmp_path / "space.toml"
    path.write_text(text)
    with pytest.raises(SpaceError, match=message):
        SearchSpace.load(path)


def test_missing_space_file():
    with pytest.raises(SpaceError, match="search space file not found"):
        SearchSpace.load("/nonexistent/space.toml")
