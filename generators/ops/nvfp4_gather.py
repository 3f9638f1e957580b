"""The ``nvfp4_gather`` op's inputs (SPEC.md sections 4 and 11.2): vLLM 0.34.0's
``cp_gather_and_upconvert_nvfp4_kv_cache(src_cache, dst, block_table, workspace_starts,
batch_size, seq_starts=None)`` over 352-byte records.

The calls are the fp8_ds_mla gather's (generators/ops/gather.py): the same requests, paging, block
table, call-site views (a column or row slice of the table, dst a row slice of a workspace), ws
forms and error inputs, drawn by its drawer and checked, materialized, described and shrunk by
the pieces both share (gather_call.py). Only the records differ (rng/nvfp4_records.py), and the
host tier is left out: vLLM's HiSparse tier is fp8-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import Drawer, Knobs
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.ops import gather, gather_call
from mlafuzz.generators.rng.hashing import Stream
from mlafuzz.generators.rng.nvfp4_records import Nvfp4Values, nvfp4_cache
from mlafuzz.generators.rng.pool import Draws
from mlafuzz.generators.spec import Paging, View, WsForm

__all__ = ["Nvfp4GatherSpec", "GENERATOR", "Nvfp4Values"]


@dataclass(frozen=True, kw_only=True)
class Nvfp4GatherSpec:
    """An nvfp4_ds_mla gather call (SPEC 11.2, addressed as section 4's gather)."""

    op: ClassVar[str] = "nvfp4_gather"
    requests: tuple[gather_call.GatherRequest, ...]
    paging: Paging = Paging()
    values: Nvfp4Values = Nvfp4Values.WRITTEN
    ws_form: WsForm = WsForm.EXACT
    pass_seq_starts: bool = True  # False: seq_starts=None (requires every seq_start == 0)
    table_view: View = View.PLAIN
    dst_view: View = View.PLAIN

    def __post_init__(self) -> None:
        gather_call.check(self, Nvfp4Values)


def draw(d: Drawer, knobs: Knobs) -> Nvfp4GatherSpec:
    """The fp8 gather's call (its drawer, host tier dropped: its chunk-call shape, a row slice of
    the table and no seq_starts, stays), then the scale class: one case in four unwritten."""
    g = gather.draw(d, knobs)
    return Nvfp4GatherSpec(
        requests=g.requests,
        paging=g.paging,
        values=Nvfp4Values.UNWRITTEN if d.integer(0, 3) == 0 else Nvfp4Values.WRITTEN,
        ws_form=g.ws_form,
        pass_seq_starts=g.pass_seq_starts,
        table_view=g.table_view,
        dst_view=g.dst_view,
    )


def _cache(draws: Draws, values: Nvfp4Values, **layout: Any) -> torch.Tensor:
    """nvfp4_ds_mla records from the bytes of the stream ``draws`` names (rng/nvfp4_records.py)."""
    return nvfp4_cache(Stream(int(draws.seed), draws.name), values, **layout)


def materialize(spec: Nvfp4GatherSpec, *, seed: int, device: str) -> Case:
    """The call's tensors on ``device``, laid out as the fp8 gather's (``gather_call.materialize``)."""
    return gather_call.materialize(spec, seed=seed, device=device, cache=_cache)


needs = gather_call.needs


# The fp8 gather's error inputs, its host tier's left out (nvfp4 has none).
INVALID = tuple(k for k in gather.INVALID if k not in gather.HOST_INVALID)

GENERATOR = Generator(
    spec_type=Nvfp4GatherSpec,
    draw=draw,
    materialize=materialize,
    features=gather_call.features,
    size=gather_call.size,
    reduce=gather_call.reduce,
    invalid=INVALID,
)
