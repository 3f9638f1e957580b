"""mlafuzz.oracles: slow, exact PyTorch references for SPEC.md.

Modules: `fpbits` (pure-Python bit-level scalar helpers), `codec` (the
fp8_ds_mla record: dequant and writer, section 2), `convert` (section 3),
`gather` (section 4), `metadata` (sections 5.1-5.3; 5.3 lives in
`fp8_separate` and is re-exported), `formats` (the cache format table and the
nvfp4_ds_mla oracles, SPEC section 11). Each oracle has a `*_loop` version
(obviously correct, tiny cases) and a vectorized one (device of its inputs),
held bit-identical by tests/test_oracles_*.py. Oracles never import
mlafuzz.kernels or mlafuzz.harness.
"""
