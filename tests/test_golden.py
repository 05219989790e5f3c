"""Behaviour pinned to a recorded reference (tests/data/golden_behaviour.json.gz, captured from the
code before families became data): for a fixed sample of every shipped search space (knob draws,
valid samples, seeds, defaults), config names round-trip to the same names, the dict forms of
that time still load, and check() gives the same reasons, in the same order, on 11 problems and
three architectures; each type's built-in defaults are the same. Hand-made faulty configs give the
same reason codes; the few messages worded anew are listed in REWORDED."""

from __future__ import annotations

import collections
import functools
import gzip
import json
from pathlib import Path

import pytest

from autogemm.families import config_from_dict, config_from_name
from autogemm.problem import Device, Problem

GOLDEN = Path(__file__).parent / "data" / "golden_behaviour.json.gz"

# Messages of single-knob checks, now generated from the knob tables, which also give every int
# knob an upper bound (old text -> new text).
REWORDED = {
    "choice: vec=3 must be one of (1, 2, 4)": "choice: vec=3 must be one of 1, 2, 4",
    "choice: bk=1 must be at least 2 (fragments are double-buffered per k pair)":
        "choice: bk=1 must be 2 to 256 (fragments are double-buffered per k pair)",
    "choice: stages=0 must be >= 1": "choice: stages=0 must be 1 to 8",
    "choice: group_m=0 must be >= 1": "choice: group_m=0 must be 1 to 1024",
}


# Reason codes of checks added after the reference was recorded (test_families covers each code).
CODES_ADDED_SINCE = {"cluster"}


@functools.lru_cache(maxsize=1)
def golden() -> dict:
    with gzip.open(GOLDEN, "rt") as stream:
        return json.load(stream)


def _spaces():
    return sorted({entry["space"] for entry in golden()["configs"]})


@functools.lru_cache(maxsize=None)
def _device(arch: str) -> Device:
    return Device.for_arch(arch)


@functools.lru_cache(maxsize=None)
def _problem(key: str) -> Problem:
    return Problem.from_key(key)


def test_the_reference_covers_every_shipped_space_and_reason_code():
    from autogemm.families import REASON_CODES

    assert _spaces() == ["simt", "wmma_bf16", "wmma_fp16", "wmma_fp64", "wmma_tf32"]
    codes = {reason.split(":")[0] for entry in golden()["configs"] for found in entry["reasons"].values()
             for reason in found}
    codes |= {reason.split(":")[0] for entry in golden()["handmade"] for reason in entry["reasons"]}
    assert codes == set(REASON_CODES) - CODES_ADDED_SINCE


@pytest.mark.parametrize("space", _spaces())
def test_names_round_trip_as_before_and_old_dicts_load(space):
    entries = [e for e in golden()["configs"] if e["space"] == space]
    assert len(entries) >= 120
    # some knob draws are out of range (the SIMT space can draw max_registers=8, which check() refuses):
    # read without range checks, as check() sees them
    for entry in entries:
        config = config_from_name(entry["name"], ranges=False)
        assert config.name == entry["name"]
        assert config_from_dict(entry["dict"], ranges=False) == config  # the form of that time (mma/wgmma booleans)
        assert config_from_dict(config.to_dict(), ranges=False) == config


@pytest.mark.parametrize("space", _spaces())
def test_check_reasons_are_unchanged(space):
    entries = [e for e in golden()["configs"] if e["space"] == space]
    compared = 0
    for entry in entries:
        config = config_from_name(entry["name"], ranges=False)
        for where, expected in entry["reasons"].items():
            arch, key = where.split("|")
            assert config.check(_problem(key), _device(arch)) == expected, (entry["name"], where)
            compared += 1
    assert compared >= 120 * 33


@pytest.mark.parametrize("kind", ["float32/fp32", "float32/tf32", "float16/fp32", "bfloat16/fp32", "float64/fp64"])
def test_the_built_in_defaults_are_unchanged(kind):
    """What `matmul` serves where nothing was tuned: each type's defaults, in order."""
    from autogemm.families import family_for

    dtype, compute = kind.split("/")
    problem = Problem(1, 1, 1, dtype=dtype, compute=compute)
    assert [list(d) for d in family_for(dtype, compute).defaults(problem)] == golden()["defaults"][kind]


def test_hand_made_faults_give_the_same_reasons():
    for entry in golden()["handmade"]:
        config = config_from_dict(entry["dict"], ranges=False)
        assert config.name == entry["name"]
        device = Device(**{**entry["device"], "compute_capability": tuple(entry["device"]["compute_capability"])})
        found = config.check(_problem(entry["problem"]), device)
        expected = [REWORDED.get(reason, reason) for reason in entry["reasons"]]
        # single-knob reasons now come in knob-table order: compare as multisets
        assert collections.Counter(found) == collections.Counter(expected), entry["name"]
