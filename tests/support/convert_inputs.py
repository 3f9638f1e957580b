"""Random inputs for convert implementations (ours and the oracle's), shared by the Triton and the
torch tests: they need no triton, so the torch cases run where triton is not installed."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tokens(g, n, k, tokens_in_table, block_size):
    """Token indices mixing -1, other negatives, in-table, just-past-table, huge."""
    cat = torch.randint(0, 10, (n, k), generator=g)
    inside = torch.randint(0, max(tokens_in_table, 1), (n, k), generator=g)
    past = tokens_in_table + torch.randint(0, 3 * block_size, (n, k), generator=g)
    neg = -torch.randint(2, 2**31, (n, k), generator=g)  # -2 .. -(2**31 - 1)
    huge = torch.randint(2**30, 2**31, (n, k), generator=g)
    tok = torch.where(cat < 5, inside, past)
    tok = torch.where(cat == 6, -1, tok)
    tok = torch.where(cat == 7, neg, tok)
    tok = torch.where(cat == 8, huge, tok)
    tok = torch.where(cat == 9, torch.full_like(tok, -(2**31)), tok)
    if tokens_in_table == 0:
        tok = torch.where(tok >= 0, past, tok)
    return tok.to(torch.int32)


def _maybe_strided(g, t, strided):
    """The same values behind non-contiguous strides (a transpose or a step of 2)."""
    if not strided or t.dim() == 0:
        return t
    if t.dim() == 1:
        wide = torch.zeros((t.shape[0], 2), dtype=t.dtype)
        wide[:, 0] = t
        return wide[:, 0]
    if int(torch.randint(0, 2, (1,), generator=g)):
        return t.t().contiguous().t()
    wide = torch.zeros((t.shape[0], 2 * t.shape[1]), dtype=t.dtype)
    wide[:, ::2] = t
    return wide[:, ::2]


@st.composite
def convert_cases(draw):
    block_n = draw(st.sampled_from([16, 32, 64, 128]))
    k = block_n * draw(st.integers(1, 3))
    return dict(
        n=draw(st.integers(0, 6)),
        k=k,
        block_n=block_n,
        block_size=draw(st.sampled_from([1, 2, 3, 16, 64])),
        num_reqs=draw(st.integers(1, 3)),
        max_blocks=draw(st.integers(0, 5)),
        prefill=draw(st.booleans()),
        num_starts=draw(st.integers(1, 3)),
        counts=draw(st.booleans()),
        strided=draw(st.booleans()),
        bad_ids=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def build_inputs(c, device="cpu"):
    g = torch.Generator().manual_seed(c["seed"])
    n, k, bs = c["n"], c["k"], c["block_size"]
    req = torch.randint(0, c["num_reqs"], (n,), generator=g, dtype=torch.int32)
    bt = torch.randint(0, 5000, (c["num_reqs"], c["max_blocks"]), generator=g, dtype=torch.int32)
    ti = _tokens(g, n, k, c["max_blocks"] * bs, bs)
    ids = starts = None
    if c["prefill"]:
        ids = torch.randint(-1, c["num_starts"], (n,), generator=g, dtype=torch.int32)
        starts = torch.randint(0, 100_000, (c["num_starts"],), generator=g, dtype=torch.int32)
    if c.get("bad_ids") and n:
        # Out-of-contract ids (SPEC: an input class): rows the oracle defines as all -1.
        req[int(torch.randint(0, n, (1,), generator=g))] = c["num_reqs"]
        req[int(torch.randint(0, n, (1,), generator=g))] = -1
        if ids is not None:
            ids[int(torch.randint(0, n, (1,), generator=g))] = c["num_starts"]
    req, bt, ti = (_maybe_strided(g, t, c["strided"]) for t in (req, bt, ti))
    if ids is not None:
        ids = _maybe_strided(g, ids, c["strided"])
    to = lambda t: None if t is None else t.to(device)
    return to(req), to(bt), to(ti), to(ids), to(starts)
