"""mlafuzz.kernels: the implementations under test and their registry.

Our Triton convert, CUDA gather and writer, the torch implementations, the
step pipeline, the planted-bug mutants, and the loaders of external ones
(vLLM's, ``module:attr``, ``path.py:attr``). Must not import mlafuzz.oracles:
an implementation under test never borrows the reference's code.
"""
