"""Planted mistake: a gather whose signature cannot take SPEC 4's call (no batch_size, no seq_starts)."""


def gather(src_cache, dst, block_table, workspace_starts):
    raise AssertionError("never called: the signature is refused when the implementation is loaded")
