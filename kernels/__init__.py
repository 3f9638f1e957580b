"""mlafuzz.kernels."""
