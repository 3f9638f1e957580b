"""Cases for the generation tests, CPU and GPU alike: one spec per op, value mode and call-site
view (SPEC 8), some at the top of a larger cache, and bit-for-bit comparison of two cases."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from mlafuzz.generators.draw import Knobs
from mlafuzz.generators.ops.convert import ConvertRequest, ConvertSpec
from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.ops.step import StepRequest, StepSpec
from mlafuzz.generators.ops.writer import WriterSpec, WriterValues
from mlafuzz.generators.spec import InputDtype, Paging, TopkMode, ValueMode, View

# LARGE's code paths (log sizes, tiling boundaries, high caches, views) at sizes the CPU runs fast.
MEDIUM = Knobs(
    max_requests=24,
    max_seq_len=5000,
    max_tokens_per_request=4,
    max_prefill_tokens=64,
    block_sizes=(64, 1, 16),
    block_ns=(32,),
    topk_multiples=(4, 1),
    max_rows=400,
    max_table=8192,
    max_records=8192,
    log_sizes=True,
    row_tiles=(2, 8, 128),
    base_one_in=4,
    base_offsets=(1 << 20,),
    views_one_in=2,
)

CONVERT_REQS = (
    ConvertRequest(seq_len=300, num_tokens=5),
    ConvertRequest(seq_len=0, num_tokens=2, prefill=True),
    ConvertRequest(seq_len=1000, num_tokens=0),
    ConvertRequest(seq_len=64, num_tokens=3, prefill=True),
)
GATHER_REQS = (
    GatherRequest(context_len=700, seq_start=130, length=300),
    GatherRequest(context_len=20, length=0),
    GatherRequest(context_len=90, seq_start=5, length=85),
)


def every_layout_spec(*, base_block: int = 0) -> Iterator[Any]:
    """A spec per op x value mode x view (and their combinations that matter)."""
    for table in View:
        for rows in (View.PLAIN, View.ROWS):
            for mode in TopkMode:
                yield ConvertSpec(
                    requests=CONVERT_REQS,
                    topk=128,
                    block_n=32,
                    topk_mode=mode,
                    prefill_workspace=True,
                    paging=Paging(
                        block_size=16, layout="shuffled", spare_blocks=2, extra_table_cols=1, base_block=base_block
                    ),
                    table_view=table,
                    rows_view=rows,
                )
        for dst in (View.PLAIN, View.ROWS):
            for values in ValueMode:
                yield GatherSpec(
                    requests=GATHER_REQS,
                    values=values,
                    ws_form="cumulative",
                    table_view=table,
                    dst_view=dst,
                    paging=Paging(block_size=16, layout="shared_prefix", spare_blocks=1, base_block=base_block),
                )
    for view in (View.PLAIN, View.COLUMNS):
        for values in WriterValues:
            for dtype in InputDtype:
                yield WriterSpec(
                    num_tokens=77,
                    values=values,
                    input_dtype=dtype,
                    padding=True,
                    inputs_view=view,
                    paging=Paging(block_size=16, spare_blocks=2, base_block=base_block),
                )
    for values in ValueMode:
        yield StepSpec(
            requests=(
                StepRequest(context_len=40, query_len=1),
                StepRequest(context_len=9, query_len=1),
                StepRequest(context_len=0, query_len=6),
            ),
            paging=Paging(block_size=4),
            values=values,
        )


def raw(t: torch.Tensor) -> torch.Tensor:
    """t's bytes (any dtype, any layout), flat, on the CPU."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of t's whole storage: a view's base, the junk around the view included."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).cpu()


def differences(a: Any, b: Any) -> list[str]:
    """What differs between two cases' tensors (bytes, layouts, bases), params and zero blocks."""
    out = []
    if dict(a.params) != dict(b.params):
        out.append(f"params {dict(a.params)} != {dict(b.params)}")
    if dict(a.zero_blocks) != dict(b.zero_blocks):
        out.append(f"zero_blocks {dict(a.zero_blocks)} != {dict(b.zero_blocks)}")
    if a.tensors.keys() != b.tensors.keys():
        return out + [f"tensors {sorted(a.tensors)} != {sorted(b.tensors)}"]
    for name, x in a.tensors.items():
        y = b.tensors[name]
        if (x is None) != (y is None):
            out.append(f"{name}: one is None")
        elif x is not None:
            if (x.dtype, x.shape, x.stride(), x.storage_offset()) != (y.dtype, y.shape, y.stride(), y.storage_offset()):
                out.append(
                    f"{name}: layout {(x.dtype, x.shape, x.stride(), x.storage_offset())} != "
                    f"{(y.dtype, y.shape, y.stride(), y.storage_offset())}"
                )
            elif not torch.equal(raw(x), raw(y)):
                out.append(f"{name}: bytes differ")
            elif x.untyped_storage().nbytes() < 64 << 20 and not torch.equal(storage_bytes(x), storage_bytes(y)):
                out.append(f"{name}: the bytes around the view differ")
    return out
