"""Kernel source: rendering templates from configs, the search spaces, and compilation to loaded kernels (NVRTC),
and ptxas's resource report of a kernel without a GPU."""
