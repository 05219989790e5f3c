"""Timing and checking kernels: the timing protocol, candidate evaluation in isolated processes, baselines, profiles, re-timing records."""
