"""vLLM's released Python and Triton code, made importable as ``vllm`` without installing vLLM.

A release's wheel (``pip download --no-deps vllm==V``) holds its Python and Triton modules as
plain text beside a CUDA extension built for that release's torch. ``tree.build_tree`` copies
out the few modules the fuzzed ops live in (``MODULES``), cuts the big ones down to the
functions the ops call (``slice.py``), and puts small modules of our own (``stubs.py``) where
those modules import vLLM's config, distributed, logging, platform and environment machinery.
The result is a folder to put on ``PYTHONPATH``: ``--impl OP=vllm`` then loads the release's
code exactly as it would from an installed vLLM. The folder lives in the mlafuzz cache, never
in the repository (``.ci/vllm_releases.sh`` drives it; ``python -m
mlafuzz.kernels.vllm_release --help``).
"""
