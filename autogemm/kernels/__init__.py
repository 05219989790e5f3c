"""Kernel source: rendering templates from configs, the search spaces, and compilation to loaded kernels (NVRTC, or nvcc without a GPU)."""
