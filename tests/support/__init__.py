"""Test support: shared helpers, CUDA case builders, planted implementations."""
