"""Each op's inputs, one module per op: spec, ``draw``, ``materialize``, ``features``, ``size``,
``reduce`` (shrink steps) and ``INVALID`` (error-input classes)."""
