"""Knob tables: a config class's fields, names, name parsing, dict form and single-knob checks all
come from its table."""

from __future__ import annotations

import dataclasses
import re

import pytest

from autogemm.families.knobs import Config, Knob


class Sample(Config):
    family = "sample"
    label = "sample"
    name_prefix = "s_"
    knobs = (
        Knob("bm", int, 64, join="", power_of_two=True, low=1, high=1024),
        Knob("bn", int, 32, join="x", power_of_two=True, low=1, high=1024),
        Knob("vec", int, 4, code="v", choices=(1, 2, 4)),
        Knob("width", int, 2, join="", choices=(1, 2, 4)),
        Knob("mode", str, "fast", choices=("fast", "safe")),
        Knob("depth", int, 3, code="d", low=1, high=5),
        Knob("flag", bool, False, omitted=False, words={True: "f"}),
        Knob("cap", int, 0, code="cap", low=16, high=255, omitted=0, why="none"),
    )


def test_fields_come_from_the_table_in_order():
    assert [f.name for f in dataclasses.fields(Sample)] == [k.name for k in Sample.knobs]
    assert Sample(128).bm == 128 and Sample().bn == 32  # positional and default values
    with pytest.raises(dataclasses.FrozenInstanceError):
        Sample().bm = 1
    assert len({Sample(), Sample()}) == 1


def test_names_are_written_and_parsed_from_the_table():
    plain = Sample()
    assert plain.name == "s_64x32_v42_fast_d3"
    full = Sample(bm=128, vec=1, width=4, mode="safe", depth=5, flag=True, cap=200)
    assert full.name == "s_128x32_v14_safe_d5_f_cap200"
    for config in (plain, full):
        assert Sample.from_name(config.name) == config


@pytest.mark.parametrize("name", [
    "s_64x32_v42_fast",  # a knob missing
    "s_64x32_v42_fast_d3_x",  # something after the last knob
    "s_64x32_v33_fast_d3",  # a concatenated knob outside its choices cannot be split
    "s_64x32_v42_fast_d03",  # parses, but is not how depth 3 is written
    "x_64x32_v42_fast_d3",  # another prefix
])
def test_names_that_are_not_canonical_are_refused(name):
    with pytest.raises(ValueError, match="not a sample config name"):
        Sample.from_name(name)


def test_a_table_that_cannot_be_parsed_is_refused_when_the_class_is_made():
    with pytest.raises(TypeError, match="b follows a with no separator"):
        class Bad(Config):  # noqa: F841
            family = "bad"
            knobs = (Knob("a", int, 1, low=0, high=9), Knob("b", int, 1, join="", low=0, high=9))
    with pytest.raises(TypeError, match="int knob a needs choices or a range"):
        class Unbounded(Config):  # noqa: F841
            family = "unbounded"
            knobs = (Knob("a", int, 1, low=0),)


def test_dict_form_round_trips_and_names_unknown_knobs():
    config = Sample(flag=True, cap=32)
    assert config.to_dict() == {"family": "sample", "bm": 64, "bn": 32, "vec": 4, "width": 2, "mode": "fast",
                                "depth": 3, "flag": True, "cap": 32}
    assert Sample.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown sample config knobs: colour"):
        Sample.from_dict({"colour": 1})
    with pytest.raises(ValueError, match="config family 'other' is not 'sample'"):
        Sample.from_dict({"family": "other"})


def test_single_knob_checks():
    assert Sample().knob_reasons() == []
    reasons = Sample(bm=96, vec=3, mode="slow", depth=9, flag=1, cap=8).knob_reasons()
    assert reasons == [
        "choice: bm=96 must be a power of two",
        "choice: vec=3 must be one of 1, 2, 4",
        "choice: mode='slow' must be one of fast, safe",
        "choice: depth=9 must be 1 to 5",
        "choice: flag=1 must be true or false",
        "choice: cap=8 must be 0 (none) or 16 to 255",
    ]
    assert Sample(bm=True).knob_reasons() == ["choice: bm=True must be an int"]
    assert Sample(bm=2048).knob_reasons() == ["choice: bm=2048 must be 1 to 1024"]


@pytest.mark.parametrize("knobs, message", [
    ({"bm": True}, "bm=True must be an int"),
    ({"bm": 128.0}, "bm=128.0 must be an int"),
    ({"bm": "128"}, "bm='128' must be an int"),
    ({"flag": 1}, "flag=1 must be true or false"),
    ({"mode": None}, "mode=None must be a string"),
    ({"bm": 4294967296}, "bm=4294967296 must be 1 to 1024"),
    ({"depth": 2**31}, "depth=2147483648 must be 1 to 5"),
])
def test_dicts_from_files_and_the_command_line_are_validated(knobs, message):
    with pytest.raises(ValueError, match=re.escape(f"invalid sample config: {message}")):
        Sample.from_dict(knobs)


def test_experiments_may_skip_ranges_but_never_types():
    assert Sample.from_dict({"bm": 96, "depth": 9}, ranges=False) == Sample(bm=96, depth=9)
    with pytest.raises(ValueError, match="bm=1.5 must be an int"):
        Sample.from_dict({"bm": 1.5}, ranges=False)
    with pytest.raises(ValueError, match="must be an object of knobs, got list"):
        Sample.from_dict([1, 2])


def test_names_naming_values_out_of_range_are_refused():
    with pytest.raises(ValueError, match="depth=9 must be 1 to 5"):
        Sample.from_name("s_64x32_v42_fast_d9")


def test_each_family_declares_its_knob_fields_for_type_checkers():
    """Type checkers cannot see the fields `Config.__init_subclass__` makes from the knob table: each
    family's class declares the same fields under TYPE_CHECKING (knobs.knob_fields writes them), so that
    `SimtConfig(bm=64)` and `config.bm` type-check. A knob added, removed or given another default
    without its declaration fails here."""
    import ast
    import inspect

    from autogemm import families
    from autogemm.families.knobs import knob_fields

    shipped = [cls for cls in families.all_families() if cls.__module__.startswith("autogemm.")]  # (not a test's own)
    assert len(shipped) >= 4
    for cls in shipped:
        tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))
        body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == cls.__name__).body
        blocks = [node for node in body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
        assert len(blocks) == 1, f"{cls.__name__} has no TYPE_CHECKING block of its knob fields"
        declared = "".join(f"        {ast.unparse(field)}\n" for field in blocks[0].body)
        assert declared == knob_fields(cls.knobs), f"{cls.__name__}: paste knobs.knob_fields(KNOBS)"
