from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autogemm.families import config_from_name
from autogemm.problem import Device, Problem
from autogemm.kernels.space import SearchSpace, SpaceError

SM90 = Device.for_arch("sm_90")
SQUARE = Problem(4096, 4096, 4096)


def test_shipped_space_loads_and_fills_every_config_field():
    space = SearchSpace.load()
    assert space.family == "simt"
    fields = {f.name for f in dataclasses.fields(space.config_class)}  # (its ClassVars are no fields)
    assert fields <= set(space.knobs) | set(space.derived)
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
    # split_reduce (a knob with an "off" position) is not named: the file, written before the knob
    # existed, still loads and keeps it off
    assert {c.split_reduce for c in space.all_configs} == {"kernel"}


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


def test_problem_rules_apply_to_the_draws_for_a_problem_and_not_to_the_space_itself(tmp_path):
    """A constraint that reads M, N, K, BATCH or SMS prunes the draws for that problem (the tuner's,
    sampling's), while the space's own configurations stay the same for every problem."""
    import dataclasses

    space = SearchSpace.load()
    assert any("M" in rule.names for rule in space.problem_constraints)
    skinny, h100 = Problem(64, 4096, 4096), dataclasses.replace(SM90, sm_count=132)
    drawn = space.sample(200, skinny, h100, seed=5)
    tiles = [-(-64 // c.bm) * -(-4096 // c.bn) for c in drawn]
    assert all(c.split_k <= 8 or t * c.split_k <= 8 * 132 for c, t in zip(drawn, tiles))
    assert any(c.split_k > 8 for c in drawn)  # the long splits are there where the output is small
    long_split = config_from_name("128x256x16_w64x64_t8x16_v44_s3_pad_g8_k16_o1_r")  # in the space, for any problem
    assert space.contains(long_split)
    assert space.suits(long_split, skinny, h100) and not space.suits(long_split, SQUARE, h100)
    values = space.knob_values(long_split)
    config, broken = space.evaluate(values, SQUARE, h100)
    assert config is None and broken == [next(r.text for r in space.problem_constraints if "split_k" in r.names)]
    assert space.evaluate(values)[0] == long_split  # no problem: no problem rules
    # a generic device (compiling without a GPU) has no SM count: the rules that read SMS are skipped
    assert space.evaluate(values, SQUARE, SM90)[0] == long_split

    text = space.path.read_text().replace('bm = "wm * warps_m"', 'bm = "min(wm * warps_m, M)"')
    path = tmp_path / "space.toml"
    path.write_text(text)
    with pytest.raises(SpaceError, match="unknown names M .*may be read by constraints, not by derived values"):
        SearchSpace.load(path)


def test_a_knob_condition_offers_the_knob_only_to_the_problems_it_serves(tmp_path):
    """`repack` is offered only where a densely stored operand's pitch is not a multiple of four
    floats: elsewhere the sampler is not asked (so it wastes no draws on it), the draws keep it
    off, and a config that repacks is not one of the problem's."""
    import dataclasses
    import random

    space = SearchSpace.load()
    h100 = dataclasses.replace(SM90, sm_count=132)
    odd, square, odd_tn = Problem(4095, 4097, 1023), SQUARE, Problem(4096, 4096, 4095, trans_a=True)
    assert space.knob_choices(odd, h100)["repack"] == (False, True)
    assert space.knob_choices(square, h100)["repack"] == (False,)
    assert space.knob_choices(odd_tn, h100)["repack"] == (False,)  # TN: A is K x M, B K x N, rows M and N long
    assert space.knob_choices(Problem(4095, 4096, 4096, trans_a=True), h100)["repack"] == (False, True)  # lda = M
    assert space.knob_choices(Problem(4095, 4096, 4096), h100)["repack"] == (False,)  # NN: pitches K and N
    drawn_square = [c for c, _ in space.uniform_draws(square, h100, random.Random(1), 4000)]
    drawn_odd = [c for c, _ in space.uniform_draws(odd, h100, random.Random(1), 4000)]
    assert drawn_square and not any(c.repack for c in drawn_square)
    assert any(c.repack for c in drawn_odd) and not all(c.repack for c in drawn_odd)
    repacking = config_from_name("128x256x16_w32x128_t8x16_v44_s3_plain_g1_k1_o1_r_sk_pk")
    assert space.contains(repacking) and space.suits(repacking, odd, h100) and not space.suits(repacking, square, h100)
    _, broken = space.evaluate(space.knob_values(repacking), square, h100)
    assert "repack: only False unless LDA % 4 != 0 or LDB % 4 != 0" in broken

    shipped = space.path.read_text()
    for condition, message in (('bogus = "K > 1"', "knob_conditions.bogus: not a searched knob"),
                               ('repack = "bm > 16"', "knob_conditions.repack: a condition is an expression over M"),
                               ("repack = 3", "knob_conditions.repack: a condition is an expression")):
        path = tmp_path / "space.toml"
        path.write_text(shipped.replace('repack = "LDA % 4 != 0 or LDB % 4 != 0"', condition))
        with pytest.raises(SpaceError, match=message):
            SearchSpace.load(path)


def test_a_space_declares_the_dtypes_it_is_for_and_a_wrong_one_is_named(tmp_path):
    from autogemm.kernels.space import SearchSpace, SpaceError

    assert SearchSpace.load("hopper").dtypes == (("float16", "fp32"), ("bfloat16", "fp32"), ("float32", "tf32"))
    text = (Path(SearchSpace.load("wmma_bf16").path)).read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('dtypes = ["bfloat16/fp32"]', 'dtypes = ["int8/fp32"]'))
    with pytest.raises(SpaceError, match="dtypes names 'int8/fp32'; the wmma family computes"):
        SearchSpace.load(bad)
    undeclared = tmp_path / "undeclared.toml"
    undeclared.write_text(text.replace('dtypes = ["bfloat16/fp32"]', ''))
    assert ("bfloat16", "fp32") in SearchSpace.load(undeclared).dtypes  # every pair its family computes


def _knob_values_by_walking_every_draw(space, config):
    """The reference for knob_values: every combination of the knobs that are not config fields."""
    import itertools

    fixed = {k: getattr(config, k) for k in space.knobs if k in space.fields}
    if any(v not in space.knobs[k] for k, v in fixed.items()):
        return None
    free = [k for k in space.knobs if k not in space.fields]
    for combo in itertools.product(*(space.knobs[k] for k in free)):
        values = {**fixed, **dict(zip(free, combo))}
        if space.evaluate(values)[0] == config:
            return values
    return None


@pytest.mark.parametrize("name", ["simt", "wmma_fp16", "wmma_tf32", "wmma_fp64", "hopper", "gemv"])
def test_knob_values_finds_the_draw_that_walking_every_combination_finds(name):
    # knob_values prunes partial draws; it must return exactly what the exhaustive walk returns, for
    # configs the space produces (seeds, samples) and for configs it cannot (a field changed)
    import dataclasses

    space = SearchSpace.load(name)
    problem = Problem(1000, 1000, 1000, dtype=space.dtypes[0][0], compute=space.dtypes[0][1])
    inside = space.seeds[:3] + space.sample(3, problem, dataclasses.replace(SM90, sm_count=132), seed=1)
    outside = []
    for config in inside[:3]:
        # a derived field moved off what its knobs give (a searched field off its choices where the
        # space derives none)
        numbers = [f for f in space.fields if type(getattr(config, f)) is int]
        field = next((f for f in numbers if f not in space.knobs), numbers[0])
        outside.append(dataclasses.replace(config, **{field: getattr(config, field) * 2 + 1}))
    assert inside and outside
    for config in inside + outside:
        expected = _knob_values_by_walking_every_draw(space, config)
        assert space.knob_values(config) == expected
        assert (expected is not None) == (config in inside)


H100_FP16 = Problem(4096, 4096, 4096, dtype="float16", compute="fp32")


@pytest.mark.parametrize("problem, device, expected", [
    (Problem(8, 4096, 4096), None, ("gemv", "simt")),
    (Problem(4096, 8, 4096), None, ("gemv", "simt")),  # a short N: GEMV kernels that swap the operands
    (Problem(17, 4096, 4096), None, ("simt",)),
    (Problem(8, 4096, 4096, dtype="float32", compute="tf32"), None, ("wmma_tf32",)),
    (Problem(4096, 4096, 4096, dtype="float32", compute="tf32"), None, ("wmma_tf32", "hopper")),
    (H100_FP16, SM90, ("hopper",)),  # (on sm_90 Hopper's 16-bit kernels supersede the tensor-core family's)
    (H100_FP16, None, ("wmma_fp16", "hopper")),
    (Problem(4096, 4096, 4096, dtype="float32", compute="tf32"), SM90, ("wmma_tf32", "hopper")),
    (H100_FP16, Device.for_arch("sm_80"), ("wmma_fp16",)),
    (Problem(16, 4096, 4096, dtype="bfloat16", compute="fp32"), SM90, ("gemv", "wmma_bf16")),
    (Problem(4096, 4096, 4096, dtype="float64", compute="fp64"), SM90, ("wmma_fp64",)),
    (Problem(4, 4096, 4096, dtype="float64", compute="fp64"), SM90, ("gemv", "wmma_fp64")),
])
def test_the_candidate_spaces_are_those_of_the_families_that_declare_themselves(problem, device, expected):
    from autogemm.kernels.space import candidate_space_names

    assert candidate_space_names(problem, device) == expected


def test_a_family_that_declares_itself_a_candidate_joins_without_the_space_module_knowing_it(monkeypatch):
    from autogemm import families
    from autogemm.families import HopperConfig
    from autogemm.kernels.space import candidate_space_names

    class Late(HopperConfig):
        family, search_space, candidate_order = "late", "late", 5

        @classmethod
        def candidate_for(cls, problem, device=None):
            return problem.dtype == "float16"

    class Early(Late):
        family, search_space, candidate_order = "early", "early", -5

    monkeypatch.setitem(families._FAMILIES, "late", Late)
    monkeypatch.setitem(families._FAMILIES, "early", Early)
    assert candidate_space_names(H100_FP16, SM90) == ("early", "hopper", "late")
    assert candidate_space_names(H100_FP16) == ("early", "wmma_fp16", "hopper", "late")
    assert candidate_space_names(SQUARE, SM90) == ("simt",)


def test_the_space_module_names_no_family():
    """Which families a tune searches is theirs to say (`candidate_for`): kernels/space.py imports no
    family's module and spells no family's name."""
    import ast

    from autogemm import families
    from autogemm.kernels import space

    tree = ast.parse(Path(space.__file__).read_text())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    assert not [module for module in imported if module.startswith("families.") and module != "families.base"]
    names = {family.family for family in families.all_families()}
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr)}
    spelled = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and id(node) not in docstrings
               and isinstance(node.value, str) and any(name in node.value for name in names)]
    assert not spelled
