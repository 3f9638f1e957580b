"""The op table's row: everything the harness knows about one op, said once.

An ``Op`` names, for one op of SPEC.md, where each of its parts lives: its spec
class, drawer, materializer, features, size, shrink steps and error-input
classes (generators/ops/<op>.py), its oracles (oracles/), how the harness calls
an implementation and which outputs it allocates and guards
(harness/ops/<op>.py), its default implementations and the contract SPEC holds
an external implementation to. The fuzz loop, the runner, the CLI, bench,
mutants and the pytest plugin read the table (``OpTable``) and never branch on
an op's name. Adding an op is one file per folder and one row in table.py.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import Knobs, SpecDrawer, draw_with_seed
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.invalid import InvalidClass
from mlafuzz.generators.spec import SpecError, spec_from_dict

if TYPE_CHECKING:
    from mlafuzz.harness.memory.guards import Guarded

Outputs = dict[str, Any]
# (the implementation, the case, its tensors as the call gets them, the sub-implementation
# source: op name -> callable, for ops whose implementation calls other ops) -> outputs
Invoke = Callable[[Callable, Case, Mapping[str, Any], Callable[[str], Callable]], Outputs]


def no_needs(case: Case) -> frozenset[str]:
    return frozenset()


@dataclass(frozen=True, kw_only=True)
class CallShape:
    """The call ``invoke`` makes of an implementation, as SPEC names its parameters: the ones it
    passes by position, then by keyword. An implementation whose signature cannot take that call
    is refused when it is loaded (one line), not found out case by case."""

    positional: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()

    def text(self, op: str) -> str:
        return f"{op}({', '.join(self.positional + tuple(f'{k}=...' for k in self.keywords))})"

    def mismatch(self, fn: Callable) -> str | None:
        """Why ``fn`` cannot be called this way, or None (also when its signature is hidden, as for
        some builtins and torch ops: the call itself then says)."""
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            return None
        try:
            signature.bind(*self.positional, **dict.fromkeys(self.keywords))
        except TypeError as exc:
            return f"its signature {signature} cannot take it: {exc}"
        return None


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One raw kernel timing of ``mlafuzz bench``: what is timed, and the bytes it must move."""

    name: str
    nbytes: int  # bytes that must be read + written
    run: dict[str, Callable[[], object]]  # impl name -> zero-arg call


@dataclass(frozen=True, kw_only=True)
class Bench:
    """What ``mlafuzz bench`` measures of an op: ``workload`` (the implementations to time, by
    name -> the raw kernel call on fixed tensors, made on the GPU) and ``realistic`` (a spec at a
    realistic shape, for ``--harness``, made and checked as a fuzz run would)."""

    workload: Callable[[dict[str, Callable]], Workload]
    realistic: Callable[[], Any]
    # With ``bench --variants``: more implementations to time (name -> callable), e.g. every tuning
    # variant of our CUDA gather, to pick its defaults on the GPU at hand.
    variants: Callable[[], dict[str, Callable]] | None = None
    # The op whose row this one's is printed after: the same job in another cache format (the
    # nvfp4_ds_mla gather beside the fp8_ds_mla gather), so the two read as one comparison.
    beside: str | None = None


@dataclass(frozen=True, kw_only=True)
class Op:
    name: str
    # Its spec class, drawer, materializer, features, size, shrink steps and error-input classes,
    # as one record (generators/ops/<op>.py's GENERATOR); the row's ``draw``, ``materialize`` ...
    # read it.
    generator: Generator
    # The oracles return the outputs a correct call gives; for an in-place input with zero blocks
    # (Case.zero_blocks), only its blocks past them (the full path compares those: check/narrow.py).
    oracle: Callable[[Case], Outputs]  # vectorized, for the hot path
    oracle_slow: Callable[[Case], Outputs]  # the loop version, for minimized cases
    invoke: Invoke
    # Outputs the harness derives from the call's tensors on the device, (case, args) -> outputs:
    # run after the call's pending CUDA error is taken (harness/check/calls.py), so an error the
    # call left unchecked is charged to it, never to these ops. The writer's other_layers.
    derived: Callable[[Case, Mapping[str, Any]], Outputs] | None = None
    # Device kind -> implementation names in order of preference: the first one this machine can
    # load is the default (our Triton convert where triton is installed, else the torch one).
    defaults: Mapping[str, tuple[str, ...]]
    contract: frozenset[str]  # the classes SPEC says any implementation must refuse
    # Outputs the harness allocates, inside guard zones, filled with a byte pattern:
    # (case, fill) -> guards, the outputs' own bytes filled too (the fast path's prefill overwrites them).
    guarded: Callable[..., dict[str, Guarded]] | None = None
    inplace: frozenset[str] = frozenset()  # inputs the op writes by design (not INPUT_MUTATION)
    needs: Callable[[Case], frozenset[str]] = no_needs  # capabilities a case needs of the implementation
    # (drawn spec, the implementation's capabilities) -> the spec without the optional features it
    # lacks: drawn options go only to implementations that have them (drive/tasks.py execute).
    fit: Callable[[Any, frozenset[str]], Any] | None = None
    # Outputs compared as multisets per row, not element by element (the one comparator's row-set
    # mode, harness/check/compare.py): (case, expected outputs) -> {name: the expected count of
    # each row's valid prefix}; after it every column must be -1. Convert's compact-to-front.
    row_sets: Callable[[Case, Mapping[str, Any]], Mapping[str, Any]] | None = None
    # Elements whose contract is only NaN-ness and sign (the comparator's ``loose``): case -> {output:
    # bool mask}. nvfp4_gather's records read through a scale byte no writer makes (SPEC 11.2).
    loose: Callable[[Case], Mapping[str, Any]] | None = None
    # Re-files the first call's findings (the comparator's, or the EXCEPTION of a call that raised):
    # (case, call, findings, ctx) -> findings. The step op files metadata problems as METADATA_MISMATCH.
    review: Callable[[Case, Any, list, Any], list] | None = None
    # Outputs that state one fact about each row (convert's out and its valid_counts): value
    # findings of one case on them whose first wrong row is the same are one finding, one bucket
    # (harness/check/linked.py), in this order (the first names the bucket).
    linked: tuple[str, ...] = ()
    call: CallShape | None = None  # the call invoke makes; None: not checked at load time
    # The GPU fast path's fused check of this op: the name of its module in harness/fast (looked up
    # there, so this room never imports that optional one); None: every case takes the full path.
    fast: str | None = None
    # Our own implementation of the op (a registry name): what bench times as "ours".
    ours: str | None = None
    # vLLM's own implementation, as (module, attribute) candidates, newest layout first: what
    # ``--impl OP=vllm`` loads from an installed vllm (kernels/vllm.py); () : vLLM has none.
    vllm: tuple[tuple[str, str], ...] = ()
    vllm_devices: frozenset[str] = frozenset({"cuda"})  # where vLLM's runs (a pure Python one: anywhere)
    # What ``mlafuzz bench`` measures of the op (None: bench leaves it out).
    bench: Bench | None = None
    # The op's slots in each round of a run's cases (drive/mix.py), about its cases per second
    # relative to the other ops', so each op gets about an equal share of a run's time.
    share: int = 1

    @property
    def spec_type(self) -> type:
        return self.generator.spec_type

    @property
    def draw(self) -> SpecDrawer:
        return self.generator.draw

    @property
    def materialize(self) -> Callable[..., Case]:
        return self.generator.materialize

    @property
    def features(self) -> Callable[[Any], set[str]]:
        return self.generator.features

    @property
    def size(self) -> Callable[[Any], dict[str, int]]:
        return self.generator.size

    @property
    def reduce(self) -> Callable[[Any], Iterator[Any]]:
        return self.generator.reduce

    @property
    def invalid(self) -> tuple[InvalidClass, ...]:
        return self.generator.invalid

    @property
    def contract_classes(self) -> tuple[InvalidClass, ...]:
        """Every class ``--contract`` may name: the rotation's, then those drawn only when promised."""
        return self.generator.invalid + self.generator.promisable

    def rotation(self, promised: Iterable[str] | None) -> list[str]:
        """The classes a run takes turns through: the op's rotation, and the out-of-rotation ones
        the run's contract (``promised``; None: the op's own) names."""
        named = set(promised or ())
        return [k.name for k in self.generator.invalid] + [k.name for k in self.generator.promisable if k.name in named]

    def invalid_class(self, name: str) -> InvalidClass:
        for k in self.contract_classes:
            if k.name == name:
                return k
        raise KeyError(f"op {self.name!r} has no error-input class {name!r}")


@dataclass(frozen=True)
class OpTable:
    ops: tuple[Op, ...]

    def __post_init__(self) -> None:
        names = [o.name for o in self.ops]
        if len(set(names)) != len(names):
            raise ValueError(f"OpTable: ops={names} holds a name twice")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.ops)

    def get(self, name: str) -> Op:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(f"op {name!r} is not in the op table (ops: {', '.join(self.names)})")

    def __contains__(self, name: object) -> bool:
        return name in self.names

    @property
    def spec_types(self) -> dict[str, type]:
        return {o.name: o.spec_type for o in self.ops}

    def with_op(self, op: Op) -> OpTable:
        return dataclasses.replace(self, ops=self.ops + (op,))

    # -- the table's own dispatch by an op's name or a spec's op tag ------------

    def decode(self, data: Any) -> Any:
        """A spec from its ``spec_to_dict`` form (one-line SpecError when malformed)."""
        return spec_from_dict(data, types=self.spec_types)

    def draw_spec(self, op: str, *, seed: int, knobs: Knobs) -> Any:
        return draw_with_seed(self.get(op).draw, seed=seed, knobs=knobs)

    def materialize(self, spec: Any, seed: int, device: str) -> Case:
        try:
            op = self.get(spec.op)
        except (AttributeError, KeyError):
            raise SpecError(f"spec={type(spec).__name__} is not the spec of an op in the table") from None
        return op.materialize(spec, seed=seed, device=device)
