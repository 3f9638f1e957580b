"""Structured findings: what the comparator and the detectors return, and what every report reads.

The record lives here, with the sinks that persist it (findings.jsonl, bundles):
the harness makes findings, reports renders them. Only the harness's verdict
(harness/ledger.py) turns findings into failures; the comparator never raises
on a mismatch.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Callable


class Kind(str, enum.Enum):
    VALUE_MISMATCH = "VALUE_MISMATCH"
    NAN_MISMATCH = "NAN_MISMATCH"
    SUBNORMAL_FLUSH = "SUBNORMAL_FLUSH"
    OOB_WRITE = "OOB_WRITE"
    MISSING_WRITE = "MISSING_WRITE"
    INPUT_MUTATION = "INPUT_MUTATION"
    METADATA_MISMATCH = "METADATA_MISMATCH"
    ACCEPTED_INVALID_INPUT = "ACCEPTED_INVALID_INPUT"
    # The impl raised on an input the spec calls valid (a Python-level failure;
    # CRASH is reserved for a worker that died).
    EXCEPTION = "EXCEPTION"
    CRASH = "CRASH"
    TIMEOUT = "TIMEOUT"
    # The call returned (or raised) with a CUDA error left pending: a launch it never checked. The
    # next CUDA call anywhere would raise it; charged to the implementation, never to the harness.
    LAUNCH_ERROR = "LAUNCH_ERROR"
    OOB_READ = "OOB_READ"  # the sanitizer saw a read outside any allocation the call was given
    NONDETERMINISM = "NONDETERMINISM"


class Severity(str, enum.Enum):
    ERROR = "error"  # fails the run
    INFO = "info"  # reported, never fails the run (e.g. an input class the contract doesn't cover)


@dataclass(frozen=True, kw_only=True)
class Mismatch:
    index: tuple[int, ...]
    expected: str  # rendered (hex bits for floats), so JSON keeps NaN payloads
    actual: str


@dataclass(frozen=True, kw_only=True)
class Finding:
    kind: Kind
    op: str
    impl: str
    case_id: str
    message: str
    cause: str = ""  # the shape of the cause, for dedup (e.g. "dst:nope", "out:past_table")
    tensor: str | None = None
    mismatches: tuple[Mismatch, ...] = ()
    count: int = 0
    total: int = 0
    max_ulp: int | None = None
    severity: Severity = Severity.ERROR
    seed: int | None = None
    spec: dict[str, Any] | None = None
    repro: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    revision: str | None = None  # the contract revision it was judged under (SPEC section 7); None: not recorded

    @property
    def dedup_key(self) -> tuple[str, str, str, str]:
        return (self.kind.value, self.op, self.impl, self.cause)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = self.kind.value
        data["severity"] = self.severity.value
        data["mismatches"] = [asdict(m) for m in self.mismatches]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        data = dict(data)
        data["kind"] = Kind(data["kind"])
        data["severity"] = Severity(data.get("severity", "error"))
        data["mismatches"] = tuple(
            Mismatch(index=tuple(m["index"]), expected=m["expected"], actual=m["actual"])
            for m in data.get("mismatches", ())
        )
        return cls(**data)


@dataclass(frozen=True, kw_only=True)
class Context:
    """Whose findings these are: one case of one implementation of one op (and, where known, the
    seed, spec and revision it was made from). ``finding`` is the one constructor every detector,
    path and driver builds a finding through, so the case's identity is written in one place."""

    op: str
    impl: str
    # The id, or how to make it: a realistic spec's JSON costs a few hundred us of host time, as
    # much as the rest of a fast-path check, and a case with no finding never needs its id.
    case_id: str | Callable[[], str]
    seed: int | None = None
    spec: dict[str, Any] | None = None
    revision: str | None = None

    def finding(self, tensor: str | None, tag: str, *, kind: Kind = Kind.VALUE_MISMATCH, **rest: Any) -> Finding:
        """A finding of this case about ``tensor`` (None: about the call, not one tensor), bucketed by
        the cause ``tensor:tag`` (just ``tag`` without a tensor)."""
        known = {
            k: v for k, v in (("seed", self.seed), ("spec", self.spec), ("revision", self.revision)) if v is not None
        }
        return Finding(
            kind=kind,
            op=self.op,
            impl=self.impl,
            case_id=self.case_id() if callable(self.case_id) else self.case_id,
            tensor=tensor,
            cause=f"{tensor}:{tag}" if tensor is not None else tag,
            **{**known, **rest},
        )
