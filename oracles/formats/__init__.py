"""Cache formats as data, and the second format's oracles (SPEC.md sections 2 and 11).

- ``table``: one torch-free row per cache format (``fp8_ds_mla`` 656 B, ``nvfp4_ds_mla``
  352 B): its planes, their byte ranges, element counts and codecs. The one place that knows
  a record's layout; every layer may read it (the no-borrowing import contract exempts it,
  as it exempts ``oracles.revisions``).
- ``writer_rules``: the nvfp4 writer's revisions (scale rounding x quotient), torch-free rows.
- ``minifloat``: e2m1 and e4m3 decoding and round-to-nearest-even with saturation.
- ``nvfp4_record``: packing and unpacking a 352-byte record.
- ``nvfp4_read``: the exact bf16 reader and the FP8 staging reader (SPEC 11.2).
- ``addressing``: SPEC 4's format-free gather addressing and its preconditions (``GatherCall``).
- ``nvfp4_gather``: both readers over the paged cache with SPEC 4's addressing.
- ``slots``: where a written token's record goes (any format's writer: its inputs, its slots).
- ``nvfp4_write``: the writer under each writer revision (SPEC 11.3).
- ``nvfp4_ties``: the exact e2m1 tie set and the tie-aware record comparison.

Like the rest of ``oracles``, each torch oracle has a ``*_loop`` version (element by element,
exact integer or rational arithmetic) and a vectorized one, held equal by tests/oracles/formats.
Nothing here imports torch at package import time: ``table`` and ``writer_rules`` stay
importable without it.
"""
