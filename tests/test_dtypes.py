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
    assert row.itemsize in ((1,) if row.scaled else (2, 4, 8)) and row.tolerance > 0
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


def test_cublas_serves_what_the_rows_say():
    from autogemm.serving import select

    assert select.CUBLAS_SERVES == {(row.name, row.compute) for row in dtypes.ROWS if row.cublas_serves}
    assert select.CUBLAS_SERVES == {("float32", "fp32"), ("float32", "tf32"), ("float16", "fp32"),
                                    ("bfloat16", "fp32"), ("float64", "fp64"), ("float8_e4m3fn", "fp32"),
                                    ("float8_e5m2", "fp32")}


@pytest.mark.parametrize("row", dtypes.ROWS, ids=lambda r: f"{r.name}-{r.compute}")
def test_the_other_families_of_a_row_compute_it(row):
    from autogemm.families import get

    for family in row.other_families:
        assert family != row.family and row in get(family).computes()


def test_the_families_compute_the_rows_that_name_them():
    from autogemm.families import GemvConfig, HopperConfig

    pairs = lambda family: [(row.name, row.compute) for row in family.computes()]  # noqa: E731
    assert pairs(HopperConfig) == [("float32", "tf32"), ("float16", "fp32"), ("bfloat16", "fp32"),
                                   ("float8_e4m3fn", "fp32"), ("float8_e5m2", "fp32")]
    assert pairs(GemvConfig) == [("float32", "fp32"), ("float16", "fp32"), ("bfloat16", "fp32"), ("float64", "fp64")]


def test_tensor_map_types_are_the_drivers_and_tf32_operands_are_read_as_tfloat32():
    for row in dtypes.ROWS:
        assert row.tensor_map_type.startswith("CU_TENSOR_MAP_DATA_TYPE_")
        assert row.operand_map_type.startswith("CU_TENSOR_MAP_DATA_TYPE_")
    tf32 = dtypes.lookup("float32", "tf32")
    assert (tf32.tensor_map_type, tf32.operand_map_type) == (dtypes.TMA_FLOAT32, dtypes.TMA_TFLOAT32)
    assert dtypes.lookup("bfloat16").operand_map_type == dtypes.TMA_BFLOAT16


def test_a_type_stored_as_raw_bits_is_found_by_its_storage():
    assert dtypes.from_bits_storage("uint16") == "bfloat16"
    assert dtypes.from_bits_storage("float32") is None and dtypes.from_bits_storage("float16") is None
    bfloat16 = dtypes.lookup("bfloat16")
    assert (bfloat16.storage, bfloat16.numpy_package, bfloat16.cupy_since) == ("uint16", "ml_dtypes", 14)
    assert (bfloat16.cuda_data_type, bfloat16.cuda_scale_type) == (dtypes.CUDA_R_16BF, dtypes.CUDA_R_32F)
    assert dtypes.lookup("float64").cuda_scale_type == dtypes.CUDA_R_64F


def test_no_module_below_serving_checks_a_dtype_by_name():
    """Facts about a type are columns of its row: the launchers, kernels and families read them there
    rather than comparing a dtype with "bfloat16" (or any other name)."""
    import ast
    from pathlib import Path

    import autogemm

    package = Path(autogemm.__file__).parent
    found = []
    for path in sorted(p for folder in ("gpu", "kernels", "families") for p in (package / folder).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                operands += [e for o in operands if isinstance(o, (ast.Tuple, ast.List, ast.Set)) for e in o.elts]
                if any(isinstance(o, ast.Constant) and o.value in dtypes.DTYPES for o in operands):
                    found.append(f"{path.relative_to(package)}:{node.lineno}: {ast.unparse(node)}")
    assert not found
