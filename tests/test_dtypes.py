"""The dtype registry: one row per (dtype, compute mode), the default first, and each row served by
a registered family with a shipped search space."""

from __future__ import annotations

import pytest

from autogemm import dtypes
from autogemm.families import family_for
from autogemm.paths import search_spaces_dir


def test_rows_are_unique_and_defaults_come_first():
    keys = [(row.name, row.compute) for row in dtypes.ROWS]
    assert len(keys) == len(set(keys))
    assert dtypes.COMPUTE_MODES["float32"] == ("fp32", "tf32")
    assert dtypes.lookup("float32").compute == "fp32"
    assert dtypes.lookup("float64").compute == "fp64"


@pytest.mark.parametrize("row", dtypes.ROWS, ids=lambda r: f"{r.name}-{r.compute}")
def test_every_row_has_a_family_and_a_shipped_space(row):
    family = family_for(row.name, row.compute)
    assert family.compute_for(row.name) == row.compute
    assert (search_spaces_dir() / f"{row.space}.toml").is_file()
    assert row.itemsize in (2, 4, 8) and row.tolerance > 0
    assert (row.tensor_core is None) == (row.family == "simt")


def test_lookup_names_the_choices():
    with pytest.raises(ValueError, match="unsupported dtype 'int8'; supported: float32, float16, bfloat16, float64"):
        dtypes.lookup("int8")
    with pytest.raises(ValueError, match="compute mode 'tf32' is not available for float64; choose from fp64"):
        dtypes.lookup("float64", "tf32")
    assert dtypes.find("float64", "tf32") is None


def test_array_names_and_typestrs():
    assert dtypes.from_array_name("<f4") == "float32"
    assert dtypes.from_array_name("bfloat16") == "bfloat16"
    assert dtypes.from_array_name("<V2") == "bfloat16"
    assert dtypes.from_array_name("uint16") is None  # only autogemm's own buffers hold bfloat16 bits as uint16
    assert dtypes.from_array_name("<i4") is None
