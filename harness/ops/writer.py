"""The ``writer`` op's row of the op table (SPEC.md section 2, "Writer"): the call, the oracles,
defaults. The cache is written in place by design.

The tile scale rule is the case's contract revision (SPEC section 7), in ``case.params["revision"]``
(drive/tasks.py puts it there; the newest when a bare case has none): the oracle follows it, and
the call gets it through the implementation's own binding (kernels/entry.py), never as an
argument of vLLM's public signature.

``skip_scale`` (vLLM 0.33.0) reaches the call only when the case has it (the ``skip_scale``
capability, read from the signature); for fp8_ds_mla it changes nothing (oracles/codec.py
``write_records_loop``), so the oracle does not read it and a writer whose bytes move with it is a
finding. A case whose cache is one layer of a packed multi-layer cache (generators/ops/writer.py)
has a second output, ``other_layers``: the packed tensor's bytes outside this layer's view, which
the oracle keeps as they were (a writer that ignores the view's offset writes layer 0 there).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import writer as gen
from mlafuzz.generators.spec import Paging
from mlafuzz.harness.ops.names import NEWEST_REVISION
from mlafuzz.harness.ops.op import Bench, CallShape, Op, Outputs, Workload
from mlafuzz.harness.ops.revision_hint import hint_revision
from mlafuzz.oracles.formats import table as formats

FORMAT = formats.get("fp8_ds_mla")  # the records this op writes

# The cause of a writer VALUE_MISMATCH that fp32 log2f could explain (see ``review``).
LOG2F_BAND_CAUSE = "kv_cache:log2f_band"


def revision_of(case: Case) -> str:
    return case.params.get("revision") or NEWEST_REVISION


def other_layers(cache: torch.Tensor) -> torch.Tensor:
    """The bytes of ``cache``'s storage outside the view (a packed cache's other layers), uint8 [n]."""
    whole = torch.empty(0, dtype=torch.uint8, device=cache.device).set_(cache.untyped_storage())
    start = cache.storage_offset() * cache.element_size()
    return torch.cat([whole[:start], whole[start + cache.numel() * cache.element_size() :]])


def _packed(case: Case) -> bool:
    return getattr(case.spec, "layers", 1) > 1


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    skip = {"skip_scale": case.params["skip_scale"]} if "skip_scale" in case.params else {}
    fn(
        t["kv_c"],
        t["k_pe"],
        t["kv_cache"],
        t["slot_mapping"],
        case.params.get("kv_cache_dtype", "fp8_ds_mla"),
        t["scale"],
        **skip,
    )
    return {"kv_cache": t["kv_cache"]}


def derived(case: Case, t: Mapping[str, Any]) -> Outputs:
    """The packed cache's other layers after the call: read by harness ops (a torch.cat), so the
    op row runs this only after the call's pending CUDA error is taken (Op.derived); inside
    ``invoke`` a zero-token launch's unchecked error tripped the cat and read as the harness's."""
    return {"other_layers": other_layers(t["kv_cache"])} if _packed(case) else {}


def _oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        from mlafuzz.oracles import codec

        fn = codec.write_records_loop if loop else codec.write_records
        t = case.tensors
        cache, slots = t["kv_cache"], t["slot_mapping"]
        zero = case.zero_blocks.get("kv_cache", 0)
        if zero:  # the blocks past the zero ones, and the slots in them (a valid case has no other)
            shift = zero * cache.shape[1]
            cache, slots = cache[zero:], torch.where(slots >= 0, slots - shift, slots)
        layers = {"other_layers": other_layers(cache)} if _packed(case) else {}  # untouched by the writer
        return {
            "kv_cache": fn(
                kv_c=t["kv_c"], k_pe=t["k_pe"], kv_cache=cache, slot_mapping=slots, revision=revision_of(case)
            ),
            **layers,
        }

    return run


def band_tokens(case: Case) -> torch.Tensor:
    """bool [T]: tokens (slot >= 0) with a tile whose scale the revision's rule rounded up from a
    prescale s where fp32 ``exp2f(ceilf(log2f(s)))`` may differ from the exact power of two the
    oracle takes; all False under a rule that does not round (2026-07)."""
    from mlafuzz.oracles.codec import tile_scales
    from mlafuzz.oracles.writer_scale import log2f_may_disagree_mask

    t = case.tensors
    slots = t["slot_mapping"]
    n = slots.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.bool)
    ts = tile_scales(kv_c=t["kv_c"][:n], revision=revision_of(case))
    rounded = ts.scale.view(torch.int32) != ts.prescale.view(torch.int32)
    hit = (log2f_may_disagree_mask(ts.prescale) & rounded).any(dim=1)
    return (hit & (slots >= 0).to(hit.device)).cpu()


def relabel_band(findings: list, *, case: Case, band: torch.Tensor, differs: torch.Tensor) -> list:
    """``findings`` with the writer's kv_cache VALUE_MISMATCH re-caused as ``LOG2F_BAND_CAUSE``
    when every token whose record differs (``differs``, bool [T]) has a tile in the log2f band
    (``band``, bool [T]): then a bit-exact writer that computes exp2f(ceilf(log2f(s))) in fp32
    could be right by vLLM's own spelling, and the finding says so instead of claiming a wrong scale."""
    if not bool(differs.any()) or bool((differs & ~band).any()):
        return findings
    out = []
    for f in findings:
        if f.kind.value == "VALUE_MISMATCH" and f.tensor == "kv_cache":
            f = dataclasses.replace(
                f,
                cause=LOG2F_BAND_CAUSE,
                message=f"{f.message}; every differing record has a tile scale s within "
                "a few ulps above a power of two, where fp32 log2f may round onto the integer"
                " (docs/contract.md, Revisions: the oracle follows the exact ceil(log2(s)))",
            )
        out.append(f)
    return out


def review(case: Case, call: Any, findings: list, ctx: Any) -> list:
    """A kv_cache mismatch that another revision's rule makes exactly says so (revision_hint.py);
    else the log2f band is named as its cause where it could explain it."""
    hinted = hint_revision(case, call, findings, oracle=_oracle(False), output="kv_cache", rule="writer_scale")
    return hinted if hinted is not findings else _band_review(case, call, findings, ctx)


def _band_review(case: Case, call: Any, findings: list, ctx: Any) -> list:
    """Name the log2f band as the cause of a kv_cache mismatch it could explain (SPEC section 7).
    Cheap unless a written tile lies in the band, which bf16 and fp16 inputs never reach
    (oracles/writer_scale.py says why); only then are the differing records looked up."""
    if not any(f.kind.value == "VALUE_MISMATCH" and f.tensor == "kv_cache" for f in findings):
        return findings
    if call.outputs is None or not isinstance(call.outputs.get("kv_cache"), torch.Tensor):
        return findings
    band = band_tokens(case)
    if not bool(band.any()):
        return findings
    # Both past the cache's zero blocks when it has them (the full path compares only those).
    expected = _oracle(False)(case)["kv_cache"].reshape(-1, FORMAT.record_bytes).cpu()
    actual = call.outputs["kv_cache"].reshape(-1, FORMAT.record_bytes).cpu()
    slots = case.tensors["slot_mapping"].cpu().to(torch.int64)
    written = slots >= 0
    slots = torch.where(written, slots - case.zero_blocks.get("kv_cache", 0) * case.tensors["kv_cache"].shape[1], slots)
    bad_record = (expected.view(torch.uint8) != actual.view(torch.uint8)).any(dim=1)
    wrote = torch.zeros_like(bad_record)
    wrote[slots[written]] = True
    if bool((bad_record & ~wrote).any()):  # a record no token writes changed: not a scale question
        return findings
    differs = torch.zeros_like(written)
    differs[written] = bad_record[slots[written]]
    return relabel_band(findings, case=case, band=band, differs=differs)


def _workload(impls: dict[str, Callable], *, tokens: int = 65536, bs: int = 64) -> Workload:
    """bench: 65536 tokens written to a cache of as many slots, in a random order."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    kv_c = torch.randn((tokens, FORMAT.nope_dim), device=dev, generator=g).to(torch.bfloat16)
    k_pe = torch.randn((tokens, FORMAT.rope_dim), device=dev, generator=g).to(torch.bfloat16)
    cache = torch.zeros((tokens // bs, bs, FORMAT.record_bytes), dtype=torch.uint8, device=dev)
    slots = torch.randperm(tokens, device=dev, generator=g)
    scale = torch.ones(1, device=dev)
    nbytes = kv_c.numel() * 2 + k_pe.numel() * 2 + slots.numel() * 8 + tokens * FORMAT.record_bytes
    run = {name: (lambda fn=fn: fn(kv_c, k_pe, cache, slots, "fp8_ds_mla", scale)) for name, fn in impls.items()}
    return Workload(name=f"writer {tokens} tokens", nbytes=nbytes, run=run)


def _realistic() -> gen.WriterSpec:
    """65536 tokens, block size 64, kv_c and k_pe split from one [T, 576] tensor as vLLM passes them."""
    return gen.WriterSpec(num_tokens=65536, paging=Paging(block_size=64, layout="shuffled"), inputs_view="columns")


WRITER = Op(
    name="writer",
    share=5,  # H200 steady cases/s, docs/performance.md: 1,031 (bench, size large); a share is ~200/s
    generator=gen.GENERATOR,
    oracle=_oracle(False),
    oracle_slow=_oracle(True),
    invoke=invoke,
    derived=derived,
    defaults={"cpu": ("torch",), "cuda": ("cuda", "torch")},
    contract=frozenset({"wrong_dtype", "wrong_shape"}),
    inplace=frozenset({"kv_cache"}),
    review=review,
    needs=gen.needs,
    fit=gen.fit,
    call=CallShape(positional=("kv_c", "k_pe", "kv_cache", "slot_mapping", "kv_cache_dtype", "scale")),
    fast="writer",
    ours="cuda",
    vllm=(("vllm._custom_ops", "concat_and_cache_mla"),),
    bench=Bench(workload=_workload, realistic=_realistic),
)
