"""autogemm: generated, tuned and cached CUDA GEMM kernels.

The GPU-facing parts (compilation, launching, tuning) import CuPy lazily, so that configurations,
search spaces and rendering work on machines without a GPU.
"""

from .config import SimtConfig
from .problem import Device, Problem
from .render import render

__version__ = "0.1.0"

__all__ = ["Device", "Problem", "SimtConfig", "render", "__version__"]
