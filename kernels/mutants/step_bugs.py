"""Planted bugs in our step pipeline (kernels/step_pipeline.py, SPEC.md section 5): each overrides
one stage with a realistic mistake, the metadata bugs vLLM fixed and look-alikes of reports against
neighbouring code (SPEC 9.5). Every one draws METADATA_MISMATCH."""

from __future__ import annotations

import itertools

from torch import Tensor

from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.kernels.step_pipeline import Fp8Separate, Split, StepPipeline, step_entry

__all__ = ["STEP_MUTANTS"]


class FullReqIdMutant(StepPipeline):
    """The bug PR #48642 fixed (SPEC 5.4): the full req_id_per_token with the decode-only indices."""

    def decode_req_id(self, req_id_per_token: Tensor, num_decode_tokens: int, num_decodes: int) -> Tensor:
        return req_id_per_token


class RequestRowsMutant(StepPipeline):
    """A look-alike of ROCm ATOM #1831 (metadata row counts that disagree: qo_indptr rows vs token
    rows): the decode subset's req_id rows counted by decode requests (qo_indptr rows), its top-k
    by decode tokens; they disagree under speculative decoding (query_len > 1)."""

    def decode_req_id(self, req_id_per_token: Tensor, num_decode_tokens: int, num_decodes: int) -> Tensor:
        return req_id_per_token[:num_decodes]


class AnyShortDenseMutant(StepPipeline):
    """A look-alike of vLLM #52512 (a prefill routed dense while the sparse path reads its cleared
    top-k): the route is dense when ANY prefill fits in K, not every one, so a long prefill goes
    dense and the sparse conversion its top-k needs never runs."""

    def dense_route(self, prefill_seq_lens: list[int], topk: int) -> bool:
        return not prefill_seq_lens or any(s <= topk for s in prefill_seq_lens)


class NoSeqStartsMutant(StepPipeline):
    """SPEC 4's old bug: context chunks gathered without seq_starts re-read chunk 0."""

    def context_seq_starts(self, starts_row: Tensor) -> Tensor | None:
        return None


class SecondSplitMutant(StepPipeline):
    """SPEC 5.3's metadata bug: the fp8 builder splits again with the default threshold (1)."""

    def fp8_separate(
        self,
        *,
        split: Split,
        qsl: list[int],
        seq_lens: list[int],
        num_tokens: int,
        workspace_rows: int,
        threshold: int,
        require_uniform: bool,
    ) -> Fp8Separate:
        try:
            again = self.split(qsl, num_tokens, 1, require_uniform)
        except ValueError:
            again = split
        return super().fp8_separate(
            split=again,
            qsl=qsl,
            seq_lens=seq_lens,
            num_tokens=num_tokens,
            workspace_rows=workspace_rows,
            threshold=threshold,
            require_uniform=require_uniform,
        )


class WsNotRestartedMutant(StepPipeline):
    """workspace_starts as one prefix sum over all prefills, not restarted per chunk."""

    def workspace_starts(self, lens: list[int], chunks: list[tuple[int, int]]) -> list[int]:
        return list(itertools.accumulate([0] + lens[:-1])) if lens else []


step_full_req_id = FullReqIdMutant()
step_no_seq_starts = NoSeqStartsMutant()
step_second_split = SecondSplitMutant()
step_ws_not_restarted = WsNotRestartedMutant()
step_request_rows = RequestRowsMutant()
step_any_short_dense = AnyShortDenseMutant()


# name (the module attribute too) -> (expected finding kind, description)
_MUTANTS: dict[str, tuple[str, str]] = {
    "step_full_req_id": (
        "METADATA_MISMATCH",
        "full req_id_per_token passed to convert with decode-only indices (docs/contract.md, step)",
    ),
    "step_no_seq_starts": (
        "METADATA_MISMATCH",
        "context chunks gathered without seq_starts (docs/contract.md, gather and step)",
    ),
    "step_second_split": (
        "METADATA_MISMATCH",
        "fp8 metadata counts from a second split with threshold 1 (docs/contract.md, step)",
    ),
    "step_ws_not_restarted": (
        "METADATA_MISMATCH",
        "workspace_starts not restarted per prefill chunk (docs/contract.md, step)",
    ),
    # SPEC 9.5's reports against neighbouring code, as look-alikes in our pipeline:
    "step_request_rows": (
        "METADATA_MISMATCH",
        "look-alike of ROCm ATOM #1831: decode req_id rows counted by requests (qo_indptr rows), top-k by tokens",
    ),
    "step_any_short_dense": (
        "METADATA_MISMATCH",
        "look-alike of vLLM #52512: a long prefill routed dense (any, not every, prefill fits K), its sparse top-k unread",
    ),
}


STEP_MUTANTS: tuple[ImplEntry, ...] = tuple(
    step_entry(name, module=__name__, attr=name, description=text, kind=kind) for name, (kind, text) in _MUTANTS.items()
)
