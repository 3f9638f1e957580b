"""The error-input generator: one transform per precondition class of SPEC sections 3 and 4.

Each class turns a valid case into one that violates exactly that precondition.
``memory_safe`` says whether an implementation that does *not* refuse it can
run it without touching memory outside its buffers; the harness only runs
unsafe classes against implementations that promise to refuse them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from mlafuzz.generators.case import Case


@dataclass(frozen=True, kw_only=True)
class InvalidClass:
    name: str
    op: str
    description: str
    memory_safe: bool
    make: Callable[[Case], Case | None]  # None: the class does not apply to this case


def _with(case: Case, *, tensors: dict | None = None, params: dict | None = None) -> Case:
    return dataclasses.replace(case, tensors={**case.tensors, **(tensors or {})},
                               params={**case.params, **(params or {})})


# --- convert (SPEC section 3: "must reject with a clear exception before launching") ---

def _length_mismatch(case: Case) -> Case | None:
    # The PR #48642 bug: the full req_id (T rows) passed with the decode-only indices.
    req = case.tensors["req_id"]
    extra = req[:1].repeat(3) if req.numel() else torch.zeros(3, dtype=req.dtype, device=req.device)
    return _with(case, tensors={"req_id": torch.cat([req, extra])})


def _convert_wrong_dtype(case: Case) -> Case | None:
    return _with(case, tensors={"req_id": case.tensors["req_id"].to(torch.int64)})


def _k_mismatch(case: Case) -> Case | None:
    k, bn = case.params["NUM_TOPK_TOKENS"], case.params["BLOCK_N"]
    return _with(case, params={"NUM_TOPK_TOKENS": k - bn}) if k > bn else None


def _k_not_multiple(case: Case) -> Case | None:
    k = case.params["NUM_TOPK_TOKENS"]
    return _with(case, params={"BLOCK_N": 2 * k})


def _bad_block_size(case: Case) -> Case | None:
    return _with(case, params={"BLOCK_SIZE": 0})


def _req_out_of_range(case: Case) -> Case | None:
    req = case.tensors["req_id"].clone()
    if not req.numel():
        return None
    req[0] = case.tensors["block_table"].shape[0]
    return _with(case, tensors={"req_id": req})


# --- gather (SPEC section 4: preconditions and host-side checks) ---

def _gather_wrong_dtype(case: Case) -> Case | None:
    return _with(case, params={"dst_dtype": "float32"})


def _gather_wrong_shape(case: Case) -> Case | None:
    return _with(case, params={"dst_cols": 575})


def _device_mismatch(case: Case) -> Case | None:
    if not case.device.startswith("cuda"):
        return None
    return _with(case, tensors={"block_table": case.tensors["block_table"].cpu()})


def _ws(case: Case) -> torch.Tensor:
    return case.tensors["workspace_starts"]


def _ws0_nonzero(case: Case) -> Case | None:
    return _with(case, tensors={"workspace_starts": _ws(case) + 1}, params={"total": case.params["total"] + 1})


def _ws_decreasing(case: Case) -> Case | None:
    b = case.params["batch_size"]
    if b < 3:  # ws[0] must stay 0, so a drop needs ws[1] > ws[2]
        return None
    ws = _ws(case).clone()
    ws[1] = ws[b - 1] + 1
    return _with(case, tensors={"workspace_starts": ws}, params={"total": max(case.params["total"], int(ws[1]))})


def _ws_past_total(case: Case) -> Case | None:
    b = case.params["batch_size"]
    ws = _ws(case).clone()
    ws[b - 1] = case.params["total"] + 1  # dst too small for where the last request starts
    ws[:b] = torch.cummax(ws[:b], 0).values
    return _with(case, tensors={"workspace_starts": ws})


def _block_index_past_table(case: Case) -> Case | None:
    starts = case.tensors["seq_starts"]
    if starts is None or case.params["total"] == 0:
        return None
    width = case.tensors["block_table"].shape[1]
    bs = case.tensors["src_cache"].shape[1]
    return _with(case, tensors={"seq_starts": starts + width * bs})


def _block_id_past_cache(case: Case) -> Case | None:
    if case.params["total"] == 0:
        return None
    table = case.tensors["block_table"].clone()
    table.fill_(case.tensors["src_cache"].shape[0] + 7)
    return _with(case, tensors={"block_table": table})


def _negative_seq_start(case: Case) -> Case | None:
    starts = case.tensors["seq_starts"]
    if starts is None or case.params["total"] == 0:
        return None
    return _with(case, tensors={"seq_starts": starts - (starts.max() + 1)})


INVALID_CLASSES: dict[str, tuple[InvalidClass, ...]] = {
    "convert": (
        InvalidClass(name="length_mismatch", op="convert", memory_safe=False, make=_length_mismatch,
                     description="req_id has more rows than token_indices (full req_id with decode-only indices)"),
        InvalidClass(name="wrong_dtype", op="convert", memory_safe=True, make=_convert_wrong_dtype,
                     description="req_id is int64"),
        InvalidClass(name="k_mismatch", op="convert", memory_safe=True, make=_k_mismatch,
                     description="NUM_TOPK_TOKENS != token_indices.shape[1]"),
        InvalidClass(name="k_not_multiple_of_block_n", op="convert", memory_safe=False, make=_k_not_multiple,
                     description="NUM_TOPK_TOKENS is not a multiple of BLOCK_N"),
        InvalidClass(name="bad_block_size", op="convert", memory_safe=True, make=_bad_block_size,
                     description="BLOCK_SIZE == 0"),
        InvalidClass(name="req_out_of_range", op="convert", memory_safe=False, make=_req_out_of_range,
                     description="a req_id >= the block table's rows (not checked by vLLM)"),
    ),
    "gather": (
        InvalidClass(name="wrong_dtype", op="gather", memory_safe=True, make=_gather_wrong_dtype,
                     description="dst is float32, not bf16"),
        InvalidClass(name="wrong_shape", op="gather", memory_safe=False, make=_gather_wrong_shape,
                     description="dst has 575 columns, not 576"),
        InvalidClass(name="device_mismatch", op="gather", memory_safe=False, make=_device_mismatch,
                     description="block_table on the CPU, the rest on the GPU"),
        InvalidClass(name="ws0_nonzero", op="gather", memory_safe=True, make=_ws0_nonzero,
                     description="workspace_starts[0] != 0"),
        InvalidClass(name="ws_decreasing", op="gather", memory_safe=False, make=_ws_decreasing,
                     description="workspace_starts decreases"),
        InvalidClass(name="ws_past_total", op="gather", memory_safe=False, make=_ws_past_total,
                     description="workspace_starts[B-1] > dst rows (dst too small)"),
        InvalidClass(name="block_index_past_table", op="gather", memory_safe=False, make=_block_index_past_table,
                     description="(seq_start + len - 1) // bs >= block table width"),
        InvalidClass(name="block_id_past_cache", op="gather", memory_safe=False, make=_block_id_past_cache,
                     description="a block id >= num_blocks"),
        InvalidClass(name="negative_seq_start", op="gather", memory_safe=False, make=_negative_seq_start,
                     description="a negative seq_start"),
    ),
}
