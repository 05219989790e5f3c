"""The element types autogemm multiplies: one row per (dtype, compute mode). This is the only table of
dtype facts in the package (sizes, storage, the family and search space that serve a row, the
verification tolerance, C++ types and conversions, tensor-core instruction shapes, the other
families that compute a row, cuBLAS's and the CUDA driver's names for it, how NumPy and CuPy hold
it). It imports nothing from autogemm, so every other module can read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TensorCoreShapes:
    """The tensor-core instructions that exist for one row (m, n, k of one instruction)."""

    wmma: tuple[int, int, int]  # one nvcuda::wmma fragment
    wmma_precision: str  # the WMMA fragment's element type for A and B
    wmma_arch: tuple[int, int]  # first compute capability with that fragment
    mma: tuple[int, int, int]  # one PTX mma.sync
    mma_input: str  # PTX type of A and B in mma.sync
    mma_arch: tuple[int, int]
    wgmma_k: int = 0  # K of one Hopper wgmma; 0: no wgmma for this type
    # whether wgmma's transpose bits let it read this type MN-major from shared memory (the 16-bit
    # types); otherwise it reads K-major only
    wgmma_transposes: bool = False


@dataclass(frozen=True)
class DType:
    name: str  # the element type of A, B and C, as NumPy names it ("float32", "bfloat16", ...)
    compute: str  # the arithmetic: "fp32", "tf32" (FP32 inputs rounded to TF32 on tensor cores), "fp64"
    itemsize: int
    # NumPy dtype of the buffers autogemm makes itself (CuPy has no bfloat16 of its own: those hold
    # the raw bits as uint16); where it is not `name`, an array of `storage` given with
    # `bfloat16_bits` (operands.describe) is read as this type's bits
    storage: str
    # how users' arrays spell the type: NumPy dtype names and __cuda_array_interface__ typestrs
    array_names: tuple[str, ...]
    family: str  # the kernel family that computes this row
    space: str  # its shipped search space (search_spaces/<space>.toml)
    tolerance: float  # relative error (to float64) a correct kernel stays under at K = 4096
    element: str  # C++ type of A, B and C
    accumulator: str  # C++ type of accumulators, alpha, beta and split-K partials
    accumulator_size: int
    to_acc: str  # C++ expression: element x -> accumulator
    from_acc: str  # C++ expression: accumulator x -> element
    tensor_core: TensorCoreShapes | None = None
    # (the columns below are named at every row)
    # the families that compute this row besides `family`, each with its one search space: a tune
    # without --space searches it too where the family is a candidate for the problem
    # (`GemmConfig.candidate_for`)
    other_families: tuple[str, ...] = field(kw_only=True)
    # whether matmul serves this row through cuBLAS where nothing generated is expected to win
    # (serving.select.CUBLAS_SERVES)
    cublas_serves: bool = field(kw_only=True)
    # cuBLAS(Lt)'s names for this row (library_types.h, cublas_api.h): the cudaDataType_t of A, B and
    # C, the cublasComputeType_t torch.matmul and cupy.matmul ask for (FP32 accumulation for the
    # 16-bit types; TF32 through CUBLAS_COMPUTE_32F_FAST_TF32), and the cudaDataType_t of alpha and
    # beta (cuBLASLt's scale type: the accumulator's)
    cuda_data_type: int = field(kw_only=True)
    cublas_compute_type: int = field(kw_only=True)
    cuda_scale_type: int = field(kw_only=True)
    # the CUtensorMapDataType (cuda.h; its member's name) of a tensor map of this type's arrays as
    # stored (C's), and of A and B as the arithmetic reads them where that differs (TF32: TMA's
    # TFLOAT32 type, which rounds FP32 to TF32 to nearest on the way into shared memory); empty:
    # TMA does not copy this type
    tensor_map_type: str = field(kw_only=True)
    tensor_map_operand_type: str = field(default="", kw_only=True)
    # the package that gives NumPy (and CuPy) this dtype, imported before `numpy.dtype(name)` is
    # asked for it (bfloat16: ml_dtypes); empty: NumPy's own
    numpy_package: str = field(default="", kw_only=True)
    # the first CuPy major version that holds and multiplies arrays of this type (0: every one)
    cupy_since: int = field(default=0, kw_only=True)
    # the dtypes D may be written in where it cannot be written in the element type itself (FP8: a
    # problem names one as its epilogue's out_dtype); empty: D is the element type unless the
    # epilogue asks for another
    output_dtypes: tuple[str, ...] = field(default=(), kw_only=True)
    # whether products of this type carry scales (FP8: D = scale_a · scale_b · A @ B, the scales a
    # problem's epilogue names, `epilogue.SCALES`)
    scaled: bool = field(default=False, kw_only=True)
    # the unit roundoff of the accumulation where the hardware adds with less precision than the
    # accumulator type holds (Hopper's FP8 wgmma keeps about 14 bits while it sums); 0: the accumulator's
    accumulation_roundoff: float = field(default=0.0, kw_only=True)

    @property
    def operand_map_type(self) -> str:
        """The tensor-map element type of A and B as the arithmetic reads them."""
        return self.tensor_map_operand_type or self.tensor_map_type

    @property
    def accumulator_storage(self) -> str:
        """NumPy dtype of alpha, beta and split-K partials."""
        return "float64" if self.accumulator == "double" else "float32"

    # Unit roundoffs (half an ulp at 1) for the element-wise error bound of verification.
    @property
    def element_roundoff(self) -> float:
        """Rounding of a result to the element type (C is stored in it)."""
        return ELEMENT_ROUNDOFF[self.name]

    @property
    def accumulator_roundoff(self) -> float:
        return self.accumulation_roundoff or ELEMENT_ROUNDOFF["float64" if self.accumulator == "double" else "float32"]

    @property
    def input_roundoff(self) -> float:
        """How far the arithmetic may move an input element: TF32 keeps 10 of FP32's 23 mantissa
        bits (a full TF32 ulp, 2^-10, so that truncating hardware paths are allowed as well as
        rounding ones); the other rows' products are exact in the accumulator."""
        return 2.0**-10 if self.compute == "tf32" else 0.0

    @property
    def smallest_normal(self) -> float:
        return SMALLEST_NORMAL[self.name]


# cudaDataType_t and cublasComputeType_t values (library_types.h, cublas_api.h)
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2 = 0, 1, 2, 14, 28, 29
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F, CUBLAS_COMPUTE_32F_FAST_TF32 = 68, 70, 77
# CUtensorMapDataType members (cuda.h), by name as cuda-bindings spells them
TMA_FLOAT16 = "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"
TMA_BFLOAT16 = "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16"
TMA_FLOAT32 = "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"
TMA_TFLOAT32 = "CU_TENSOR_MAP_DATA_TYPE_TFLOAT32"
TMA_FLOAT64 = "CU_TENSOR_MAP_DATA_TYPE_FLOAT64"
TMA_UINT8 = "CU_TENSOR_MAP_DATA_TYPE_UINT8"  # (TMA copies bytes: FP8 goes as UINT8)

ELEMENT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53,
                    "float8_e4m3fn": 2.0**-4, "float8_e5m2": 2.0**-3}
SMALLEST_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float64": 2.0**-1022,
                   "float8_e4m3fn": 2.0**-6, "float8_e5m2": 2.0**-14}
# D's dtypes of an FP8 product (FP32 accumulators converted once)
FP8_OUTPUTS = ("bfloat16", "float16", "float32")
# how far Hopper's FP8 wgmma may move a sum: it keeps about 14 bits of mantissa while it accumulates
FP8_ACCUMULATION_ROUNDOFF = 2.0**-14


def _fp8_row(name: str, kind: str, cuda_data_type: int) -> DType:
    """An FP8 row: `name` as NumPy (ml_dtypes) and PyTorch spell it, `kind` as PTX and CUDA's C++ type do."""
    return DType(name, "fp32", 1, "uint8", (name,), "hopper", "hopper_fp8", 2e-2,
                 f"__nv_fp8_{kind}", "float", 4, "float(x)", f"__nv_fp8_{kind}(x)",
                 TensorCoreShapes((0, 0, 0), "", (9, 0), (16, 8, 32), kind, (8, 9), wgmma_k=32),
                 other_families=(), cublas_serves=True, cuda_data_type=cuda_data_type,
                 cublas_compute_type=CUBLAS_COMPUTE_32F, cuda_scale_type=CUDA_R_32F, tensor_map_type=TMA_UINT8,
                 numpy_package="ml_dtypes", output_dtypes=FP8_OUTPUTS, scaled=True,
                 accumulation_roundoff=FP8_ACCUMULATION_ROUNDOFF)


ROWS: tuple[DType, ...] = (
    # the first row of a dtype is its default compute mode
    DType("float32", "fp32", 4, "float32", ("float32", "<f4"), "simt", "simt", 1e-5,
          "float", "float", 4, "x", "x",
          other_families=("gemv",), cublas_serves=True, cuda_data_type=CUDA_R_32F,
          cublas_compute_type=CUBLAS_COMPUTE_32F, cuda_scale_type=CUDA_R_32F, tensor_map_type=TMA_FLOAT32),
    DType("float32", "tf32", 4, "float32", ("float32", "<f4"), "wmma", "wmma_tf32", 5e-3,
          "float", "float", 4, "x", "x",
          TensorCoreShapes((16, 16, 8), "wmma::precision::tf32", (8, 0), (16, 8, 8), "tf32", (8, 0), wgmma_k=8),
          other_families=("hopper",), cublas_serves=True, cuda_data_type=CUDA_R_32F,
          cublas_compute_type=CUBLAS_COMPUTE_32F_FAST_TF32, cuda_scale_type=CUDA_R_32F,
          tensor_map_type=TMA_FLOAT32, tensor_map_operand_type=TMA_TFLOAT32),
    DType("float16", "fp32", 2, "float16", ("float16", "<f2"), "wmma", "wmma_fp16", 1e-2,
          "__half", "float", 4, "__half2float(x)", "__float2half_rn(x)",
          TensorCoreShapes((16, 16, 16), "__half", (7, 0), (16, 8, 16), "f16", (8, 0), wgmma_k=16,
                           wgmma_transposes=True),
          other_families=("gemv", "hopper"), cublas_serves=True, cuda_data_type=CUDA_R_16F,
          cublas_compute_type=CUBLAS_COMPUTE_32F, cuda_scale_type=CUDA_R_32F, tensor_map_type=TMA_FLOAT16),
    DType("bfloat16", "fp32", 2, "uint16", ("bfloat16", "|V2", "<V2"), "wmma", "wmma_bf16", 1e-2,
          "__nv_bfloat16", "float", 4, "__bfloat162float(x)", "__float2bfloat16_rn(x)",
          TensorCoreShapes((16, 16, 16), "__nv_bfloat16", (8, 0), (16, 8, 16), "bf16", (8, 0), wgmma_k=16,
                           wgmma_transposes=True),
          other_families=("gemv", "hopper"), cublas_serves=True, cuda_data_type=CUDA_R_16BF,
          cublas_compute_type=CUBLAS_COMPUTE_32F, cuda_scale_type=CUDA_R_32F, tensor_map_type=TMA_BFLOAT16,
          numpy_package="ml_dtypes", cupy_since=14),
    # mma.sync m16n8k8 in FP64 is new in sm_90 (sm_80 has only the m8n8k4 that WMMA uses)
    DType("float64", "fp64", 8, "float64", ("float64", "<f8"), "wmma", "wmma_fp64", 1e-12,
          "double", "double", 8, "x", "x",
          TensorCoreShapes((8, 8, 4), "double", (8, 0), (16, 8, 8), "f64", (9, 0)),
          other_families=("gemv",), cublas_serves=True, cuda_data_type=CUDA_R_64F,
          cublas_compute_type=CUBLAS_COMPUTE_64F, cuda_scale_type=CUDA_R_64F, tensor_map_type=TMA_FLOAT64),
    # FP8 (Hopper): A and B K-major (wgmma reads 8-bit types K-major only), FP32 accumulation, D written
    # as one of FP8_OUTPUTS, scaled per tensor, per row or per block. NumPy and CuPy hold them as ml_dtypes' types or
    # as raw uint8 bits; there is no WMMA of these types (the fields say so with zeros), mma.sync
    # m16n8k32 exists from sm_89
    _fp8_row("float8_e4m3fn", "e4m3", CUDA_R_8F_E4M3),
    _fp8_row("float8_e5m2", "e5m2", CUDA_R_8F_E5M2),
)

DTYPES: tuple[str, ...] = tuple(dict.fromkeys(row.name for row in ROWS))
# compute modes per dtype, the default first
COMPUTE_MODES: dict[str, tuple[str, ...]] = {
    name: tuple(row.compute for row in ROWS if row.name == name) for name in DTYPES
}
_BY_KEY = {(row.name, row.compute): row for row in ROWS}
_BY_ARRAY_NAME = {spelling: row.name for row in ROWS for spelling in row.array_names}
# (uint8 holds both FP8 types' bits: an array of uint8 is read as FP8 only where the caller names which)
_BY_BITS_STORAGE = {row.storage: row.name for row in ROWS if row.storage != row.name and not row.scaled}


def find(dtype: str, compute: str) -> DType | None:
    return _BY_KEY.get((dtype, compute))


def lookup(dtype: str, compute: str = "") -> DType:
    """The row of a dtype and compute mode (empty: the default mode); ValueError names the choices."""
    if dtype not in COMPUTE_MODES:
        raise ValueError(f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    row = _BY_KEY.get((dtype, compute or COMPUTE_MODES[dtype][0]))
    if row is None:
        raise ValueError(f"compute mode {compute!r} is not available for {dtype}; "
                         f"choose from {', '.join(COMPUTE_MODES[dtype])}")
    return row


def from_array_name(name: str) -> str | None:
    """The dtype of an array whose NumPy dtype name or typestr is `name`; None if unsupported."""
    return _BY_ARRAY_NAME.get(name)


def from_bits_storage(name: str) -> str | None:
    """The dtype whose raw bits autogemm's own buffers hold in arrays of NumPy dtype `name` (uint16:
    bfloat16's), the `storage` column of a type that is not its own; None for any other name."""
    return _BY_BITS_STORAGE.get(name)


def name_of(dtype: Any) -> str:
    """A dtype's text as autogemm names dtypes ("float8_e4m3fn", "bfloat16"), from a torch, NumPy or CuPy
    dtype or a name; not checked against the table (callers say what they take)."""
    text = str(dtype).removeprefix("torch.")
    if not isinstance(dtype, str):
        try:
            text = np.dtype(dtype).name
        except TypeError:
            pass  # (a torch dtype: its name without the module)
    return text
