"""Case features for coverage: which corners of the input space a run has visited.

Read off the spec alone (no tensors), so the fuzz driver can count them for
free. A feature registry maps each spec type to its feature function.
"""

from __future__ import annotations

from typing import Any, Callable

from mlafuzz.generators.spec import ConvertSpec, GatherSpec, TopkMode

FEATURE_FNS: dict[type, Callable[[Any], set[str]]] = {}


def _features_of(spec_type: type):
    def register(fn: Callable[[Any], set[str]]) -> Callable[[Any], set[str]]:
        FEATURE_FNS[spec_type] = fn
        return fn
    return register


_TOPK_FEATURES = {
    TopkMode.PADDED: {"idx:-1"}, TopkMode.NEGATIVE: {"idx:-1", "idx:negative"},
    TopkMode.PAST_TABLE: {"idx:-1", "idx:past_table"}, TopkMode.PAST_SEQ_LEN: {"idx:-1", "idx:past_seq_len"},
    TopkMode.MIXED: {"idx:-1", "idx:negative", "idx:past_table", "idx:past_seq_len"}, TopkMode.VALID: set(),
}


@_features_of(ConvertSpec)
def convert_features(spec: ConvertSpec) -> set[str]:
    prefill = [r.prefill for r in spec.requests if r.num_tokens]
    out = {f"layout:{spec.paging.layout.value}", f"bs:{'1' if spec.paging.block_size == 1 else 'n'}"}
    out |= {"batch:prefill-only"} if prefill and all(prefill) else {"batch:mixed"} if any(prefill) else {
        "batch:decode-only"}
    out |= _TOPK_FEATURES[spec.topk_mode]
    if any(r.seq_len > spec.paging.block_size for r in spec.requests):
        out.add("block-boundary")
    if any(r.num_tokens == 0 for r in spec.requests):
        out.add("empty-request")
    return out


@_features_of(GatherSpec)
def gather_features(spec: GatherSpec) -> set[str]:
    bs = spec.paging.block_size
    out = {f"values:{spec.values.value}", f"layout:{spec.paging.layout.value}", f"ws:{spec.ws_form.value}"}
    if any(r.length == 0 for r in spec.requests):
        out.add("empty-request")
    if any(r.seq_start > 0 for r in spec.requests):
        out.add("seq_starts")
    if any(r.length and (r.seq_start // bs) != ((r.seq_start + r.length - 1) // bs) for r in spec.requests):
        out.add("block-boundary")
    if sum(r.length for r in spec.requests) == 0:
        out.add("total==0")
    return out


def features(spec: Any) -> set[str]:
    fn = FEATURE_FNS.get(type(spec))
    return fn(spec) if fn else set()
