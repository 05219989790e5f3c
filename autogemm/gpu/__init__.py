"""The GPU side of a call: CuPy/CUDA runtime access, operand layouts, launchers of generated kernels (packed, TMA, repacking), cuBLAS(Lt), CUDA graph capture."""
