"""The ``nvfp4_writer`` op's inputs (SPEC.md section 11.3): vLLM's ``concat_and_cache_mla(kv_c,
k_pe, kv_cache, slot_mapping, kv_cache_dtype="nvfp4_ds_mla", scale)`` into 352-byte records.

The calls are the fp8_ds_mla writer's (generators/ops/writer.py): its spec fields, drawer, input
pools (normal, wide, extreme, NaN: the NaN class is the tagged one, judged under the revision's
rule), padding slots, the column view of one [T, 576] tensor, shrink steps and error inputs. Only
the cache differs: nvfp4_ds_mla records (rng/nvfp4_records.py), so a write to a wrong slot shows.

How the case is judged travels with its spec, so a bundle, a replay and a shrink judge it alike:
``writer_revision`` (a row of ``oracles.formats.writer_rules``, from the run's knobs: fuzz
--nvfp4-writer) and ``ties`` (``either``: an exact e2m1 tie's other neighbouring code is accepted
and counted apart; fuzz --ties). Neither draws from the case's randomness.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import ClassVar

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import Drawer, Knobs
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.ops import writer
from mlafuzz.generators.rng.hashing import Stream
from mlafuzz.generators.rng.nvfp4_records import Nvfp4Values, nvfp4_cache
from mlafuzz.generators.rng.pool import Draws
from mlafuzz.oracles.formats import writer_rules

__all__ = ["Nvfp4WriterSpec", "GENERATOR", "KV_CACHE_DTYPE", "WriterRevision", "Ties"]

KV_CACHE_DTYPE = "nvfp4_ds_mla"


#: The writer revisions by name (the table's rows), as a spec field's values.
WriterRevision = enum.Enum("WriterRevision", {n.replace(".", "_").upper(): n for n in writer_rules.names()}, type=str)


class Ties(str, enum.Enum):
    EXACT = "exact"  # every byte as the revision writes it
    EITHER = "either"  # at an exact e2m1 tie, either neighbouring code (counted apart, never a failure)


@dataclass(frozen=True, kw_only=True)
class Nvfp4WriterSpec(writer.WriterSpec):
    """An nvfp4_ds_mla writer call: the fp8 writer's fields, another op, and how it is judged."""

    op: ClassVar[str] = "nvfp4_writer"
    writer_revision: WriterRevision = WriterRevision(writer_rules.DEFAULT)
    ties: Ties = Ties.EXACT


def draw(d: Drawer, knobs: Knobs) -> Nvfp4WriterSpec:
    s = writer.draw(d, knobs)
    return Nvfp4WriterSpec(
        **{f.name: getattr(s, f.name) for f in dataclasses.fields(s)},
        writer_revision=WriterRevision(knobs.nvfp4_writer),
        ties=Ties(knobs.nvfp4_ties),
    )


def materialize(spec: Nvfp4WriterSpec, *, seed: int, device: str) -> Case:
    """As writer.materialize (``writer.call_case``), the cache's pool full of other nvfp4 records."""

    def cache(draws: Draws, pool: int) -> torch.Tensor:
        return nvfp4_cache(
            Stream(int(seed), "nvfp4_writer/cache"),
            Nvfp4Values.WRITTEN,
            pool_blocks=pool,
            block_size=spec.paging.block_size,
            base_block=spec.paging.base_block,
            device=device,
        )

    params = {
        "kv_cache_dtype": KV_CACHE_DTYPE,
        "nvfp4_revision": spec.writer_revision.value,
        "nvfp4_ties": spec.ties.value,
    }
    return writer.call_case(spec, seed=seed, device=device, cache=cache, params=params)


GENERATOR = Generator(
    spec_type=Nvfp4WriterSpec,
    draw=draw,
    materialize=materialize,
    features=writer.features,
    size=writer.size,
    reduce=writer.reduce,
    invalid=writer.INVALID,
)
