"""The ``nvfp4_writer`` op's row of the op table (SPEC.md section 11.3): vLLM's
``concat_and_cache_mla(..., kv_cache_dtype="nvfp4_ds_mla")``, its cache compared byte for byte
with the oracle's under the nvfp4 writer revision (``oracles.formats.writer_rules``): vLLM's CUDA
writer's, ``rn_bump.mul_recip``, the default; a case names another through its spec (fuzz
--nvfp4-writer), which its params carry (``params["nvfp4_revision"]``).

Its review (a mismatching case only): under ``--ties either`` (``params["nvfp4_ties"]``) a cache
whose every differing byte is an exact e2m1 tie's other neighbour (``oracles.formats.nvfp4_ties``)
is an info, "bit-exact except N ties", not a failure; a mismatch that another writer revision's
oracle makes byte for byte says which ("matches nvfp4 writer rn.div exactly: --nvfp4-writer
rn.div"), as ``revision_hint`` does for the contract revisions."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import nvfp4_writer as gen
from mlafuzz.generators.spec import Paging
from mlafuzz.harness.ops.op import Bench, CallShape, Op, Outputs, Workload
from mlafuzz.oracles.formats import writer_rules
from mlafuzz.oracles.formats.table import get
from mlafuzz.reports.findings import Finding, Kind, Severity

_FORMAT = get("nvfp4_ds_mla")


def revision_of(case: Case) -> str:
    return case.params.get("nvfp4_revision") or writer_rules.DEFAULT


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    kv_cache_dtype = case.params.get("kv_cache_dtype", gen.KV_CACHE_DTYPE)
    fn(t["kv_c"], t["k_pe"], t["kv_cache"], t["slot_mapping"], kv_cache_dtype, t["scale"])
    return {"kv_cache": t["kv_cache"]}


def _oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        from mlafuzz.oracles.formats import nvfp4_write

        fn = nvfp4_write.write_records_loop if loop else nvfp4_write.write_records
        t = case.tensors
        cache, slots = t["kv_cache"], t["slot_mapping"]
        zero = case.zero_blocks.get("kv_cache", 0)
        if zero:  # the blocks past the zero ones, and the slots in them (a valid case has no other)
            shift = zero * cache.shape[1]
            cache, slots = cache[zero:], torch.where(slots >= 0, slots - shift, slots)
        out = fn(kv_c=t["kv_c"], k_pe=t["k_pe"], kv_cache=cache, slot_mapping=slots, revision=revision_of(case))
        return {"kv_cache": out}

    return run


def _shifted(case: Case) -> tuple[torch.Tensor, int]:
    """(slot_mapping past the case's zero blocks, as the oracle and the narrowed output see them; rows)."""
    slots = case.tensors["slot_mapping"].reshape(-1).long()
    shift = case.zero_blocks.get("kv_cache", 0) * case.tensors["kv_cache"].shape[1]
    return torch.where(slots >= 0, slots - shift, slots), int(slots.shape[0])


def tie_hits(case: Case, expected: torch.Tensor, actual: torch.Tensor) -> int | None:
    """The tie hits of ``actual`` against ``expected`` (caches past the zero blocks) where they are
    its only differences; None where another byte differs."""
    from mlafuzz.oracles.formats.nvfp4_ties import compare_records

    rec = _FORMAT.record_bytes
    exp = expected.detach().cpu().contiguous().view(torch.uint8).reshape(-1, rec)
    act = actual.detach().cpu().contiguous().view(torch.uint8).reshape(-1, rec)
    slots, n = _shifted(case)
    slots = slots.cpu()
    tok = torch.nonzero(slots >= 0).reshape(-1)
    uniq, inverse = torch.unique(slots[tok], return_inverse=True)
    last = torch.full_like(uniq, -1).scatter_reduce(0, inverse, tok, reduce="amax")  # a later token wins
    written = torch.zeros(exp.shape[0], dtype=torch.bool)
    written[uniq] = True
    if not torch.equal(exp[~written], act[~written]):
        return None
    kv_c = case.tensors["kv_c"][:n].cpu()[last]
    report = compare_records(kv_c=kv_c, expected=exp[uniq], actual=act[uniq])
    return report.tie_hits if report.exact_except_ties else None


def matching_writer(case: Case, actual: torch.Tensor) -> str | None:
    """The other writer revision whose oracle writes ``actual`` byte for byte, or None; of several,
    the one differing from the case's in the fewest rules (the user changes one thing)."""
    current = writer_rules.get(revision_of(case))

    def distance(name: str) -> int:
        return sum(writer_rules.get(name).rules[k] != v for k, v in current.rules.items())

    want = actual.detach().cpu().contiguous().view(torch.uint8)
    for name in sorted((n for n in writer_rules.names() if n != current.name), key=distance):
        other = dataclasses.replace(case, params={**case.params, "nvfp4_revision": name})
        got = _oracle(False)(other)["kv_cache"].cpu().contiguous().view(torch.uint8)
        if got.shape == want.shape and torch.equal(got, want):
            return name
    return None


def review(case: Case, call: Any, findings: list, ctx: Any) -> list:
    """Ties accepted under ``--ties either``, else a mismatch named by the writer revision it matches."""
    bad = [f for f in findings if f.kind is Kind.VALUE_MISMATCH and f.tensor == "kv_cache"]
    actual = (call.outputs or {}).get("kv_cache")
    if not bad or not isinstance(actual, torch.Tensor):
        return findings
    if case.params.get("nvfp4_ties") == "either" and len(bad) == len(findings):
        ties = tie_hits(case, _oracle(False)(case)["kv_cache"], actual)
        if ties is not None:
            return [_tied(f, ties) for f in findings]
    other = matching_writer(case, actual)
    if other is None:
        return findings
    hint = f"matches nvfp4 writer {other} exactly: --nvfp4-writer {other}"
    return [
        dataclasses.replace(f, message=f"{f.message}; {hint}", extra={**f.extra, "matches_nvfp4_writer": other})
        if f in bad
        else f
        for f in findings
    ]


def _tied(f: Finding, ties: int) -> Finding:
    return dataclasses.replace(
        f,
        severity=Severity.INFO,
        cause="kv_cache:ties",
        message=f"bit-exact except {ties} ties (--ties either: at an exact e2m1 tie either neighbouring code)",
        mismatches=(),
        extra={**f.extra, "tie_hits": ties},
    )


def _workload(impls: dict[str, Callable], *, tokens: int = 65536, bs: int = 64) -> Workload:
    """bench: 65536 tokens written to a cache of as many slots, in a random order."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    kv_c = torch.randn((tokens, 512), device=dev, generator=g).to(torch.bfloat16)
    k_pe = torch.randn((tokens, 64), device=dev, generator=g).to(torch.bfloat16)
    cache = torch.zeros((tokens // bs, bs, _FORMAT.record_bytes), dtype=torch.uint8, device=dev)
    slots = torch.randperm(tokens, device=dev, generator=g)
    scale = torch.ones(1, device=dev)
    nbytes = kv_c.numel() * 2 + k_pe.numel() * 2 + slots.numel() * 8 + tokens * _FORMAT.record_bytes
    run = {name: (lambda fn=fn: fn(kv_c, k_pe, cache, slots, gen.KV_CACHE_DTYPE, scale)) for name, fn in impls.items()}
    return Workload(name=f"nvfp4_writer {tokens} tokens", nbytes=nbytes, run=run)


def _realistic() -> gen.Nvfp4WriterSpec:
    """65536 tokens, block size 64, kv_c and k_pe split from one [T, 576] tensor as vLLM passes them."""
    return gen.Nvfp4WriterSpec(num_tokens=65536, paging=Paging(block_size=64, layout="shuffled"), inputs_view="columns")


NVFP4_WRITER = Op(
    name="nvfp4_writer",
    share=8,  # our Triton writer, steady cases/s on an H100 (session 17): 1,660; a share is ~200/s
    generator=gen.GENERATOR,
    oracle=_oracle(False),
    oracle_slow=_oracle(True),
    invoke=invoke,
    # On a GPU our Triton writer (the kernel under test, and without the torch one's host syncs: 1.8x
    # its cases/s on an H100); on a CPU the torch one (the interpreter is slow).
    defaults={"cpu": ("torch",), "cuda": ("triton", "torch")},
    contract=frozenset({"wrong_dtype", "wrong_shape"}),  # as the fp8 writer's
    review=review,
    inplace=frozenset({"kv_cache"}),
    call=CallShape(positional=("kv_c", "k_pe", "kv_cache", "slot_mapping", "kv_cache_dtype", "scale")),
    ours="triton",  # bench times it beside the torch writer
    vllm=(("vllm._custom_ops", "concat_and_cache_mla"),),
    bench=Bench(workload=_workload, realistic=_realistic, beside="writer"),
    fast="nvfp4.writer",  # the GPU fast path's check: harness/fast/nvfp4/writer.py
)
