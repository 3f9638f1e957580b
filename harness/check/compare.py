"""The one comparator: expected vs actual tensors -> structured findings.

Order of checks follows FlashMLA's kernelkit: shape and dtype, then NaN
positions, then values. Floats are compared as bit patterns: bit-exact by
default, or within ``Policy.ulp`` units in the last place. Integers are exact.
Messages follow torch.testing: ``Mismatched elements: 12 / 4096 (0.3%)``,
``greatest ulp distance 7 at [3, 129] (expected 0x3f80, got 0x3f81)``.

Row-set mode (``row_sets``, the op row says which outputs): an output whose rows
hold an unspecified order (convert's compact-to-front, SPEC section 7) is
compared row by row as a multiset of its first ``counts[i]`` values, with -1
in every later column (``oracles.convert.rows_as_sets_equal``). Same checks
before it (shape, dtype), one finding per output like every other mode.

``skip`` names elements another finding already accounts for (the write map's
never-written elements: their values are the fill pattern, so a value or NaN
mismatch there is the MISSING_WRITE again, not a second problem). They are
left out of the value and NaN checks; every other element is compared.

``loose`` names elements whose contract is only their NaN-ness and sign (an nvfp4_ds_mla record
read through a scale byte no writer makes, SPEC 11.2): both sides are compared as what
``_loose_bits`` makes of them (a NaN, or a zero of the element's sign), so a finding there shows
those canonical bits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping

import torch

from mlafuzz.harness.memory.bits import TOGETHER_BYTES, differ_flag, differ_flag_any, host_copies, read_flags
from mlafuzz.oracles.convert import rows_as_sets_equal
from mlafuzz.reports.findings import Context, Finding, Kind, Mismatch

MAX_SHOWN = 5

_BITS_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
# Smallest normal magnitude per dtype, as bits (exponent field == 1).
_MIN_NORMAL_BITS = {torch.bfloat16: 0x0080, torch.float16: 0x0400, torch.float32: 0x00800000}


@dataclass(frozen=True, kw_only=True)
class Policy:
    """How close is equal. ulp=0 is bit-exact (the default: SPEC asks for exact results)."""

    ulp: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.ulp, bool) or not isinstance(self.ulp, int) or self.ulp < 0:
            raise ValueError(f"Policy: ulp={self.ulp!r} must be an int >= 0")


def _fmt_index(flat: int, shape: tuple[int, ...], origin: int = 0) -> tuple[int, ...]:
    """The index of flat element ``flat``; ``origin`` is added to the first (a tensor compared from
    that row on: an in-place output's blocks past its zero blocks)."""
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    if idx:
        idx[-1] += origin
    return tuple(reversed(idx))


def _hex(v: int, width: int) -> str:
    return f"0x{v & ((1 << width) - 1):0{width // 4}x}"


def _ordered(bits: torch.Tensor, width: int) -> torch.Tensor:
    """Map float bit patterns to integers whose difference is the ulp distance.

    Sign-magnitude to two's-complement order; -0 maps to -1 and +0 to 0, so a
    sign flip on zero counts as one ulp (bit-exact mode must see it).
    """
    b = bits.to(torch.int64) & ((1 << width) - 1)
    mag = b & ((1 << (width - 1)) - 1)
    neg = (b >> (width - 1)) & 1
    return torch.where(neg == 1, -mag - 1, mag)


def _shape_finding(ctx: Context, name: str, exp: torch.Tensor, act: torch.Tensor) -> Finding:
    return ctx.finding(
        name,
        "shape",
        message=f"{name}: expected shape {tuple(exp.shape)} dtype {exp.dtype}, "
        f"got shape {tuple(act.shape)} dtype {act.dtype}",
    )


def _skip_mask(skip: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor | None:
    """``skip`` as a flat mask of ``n`` elements on ``device`` (None: skip nothing)."""
    if skip is None or skip.numel() != n or not bool(skip.any()):
        return None
    return skip.reshape(-1).to(device=device, dtype=torch.bool)


def _loose_bits(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``t`` with its ``mask`` elements made the canonical NaN, or +-0 of their sign (payloads,
    magnitudes and the sign of a NaN are no contract there)."""
    view = _BITS_VIEW[t.dtype]
    width = 16 if view is torch.int16 else 32
    bits = t.contiguous().view(view)
    nan = torch.tensor(0x7FC0 if width == 16 else 0x7FC00000, dtype=view, device=t.device)
    sign = bits & torch.tensor(-(1 << (width - 1)), dtype=view, device=t.device)
    canon = torch.where(torch.isnan(t), nan, sign)
    return torch.where(mask.to(t.device), canon, bits).view(t.dtype)


def _skipped_note(skip: torch.Tensor | None) -> str:
    return f"; {int(skip.sum())} never-written elements left to MISSING_WRITE" if skip is not None else ""


def _float_findings(
    ctx: Context,
    name: str,
    exp: torch.Tensor,
    act: torch.Tensor,
    policy: Policy,
    skip: torch.Tensor | None,
    origin: int = 0,
) -> list[Finding]:
    # Masks and counts stay on the tensors' device; only the few shown mismatches cross to the host.
    width = 16 if exp.dtype in (torch.bfloat16, torch.float16) else 32
    view = _BITS_VIEW[exp.dtype]
    e_bits = exp.contiguous().view(view).reshape(-1)
    a_bits = act.contiguous().view(view).reshape(-1).to(e_bits.device)
    # Only outputs whose bytes differ get here (``_differs``, for the whole case in one sync).
    e_nan = torch.isnan(exp.contiguous().reshape(-1))
    a_nan = torch.isnan(act.contiguous().reshape(-1)).to(e_nan.device)
    total = e_bits.numel()
    shape = tuple(exp.shape)
    keep = _skip_mask(skip, total, e_bits.device)
    note = _skipped_note(keep)

    def shown(mask: torch.Tensor) -> tuple[Mismatch, ...]:
        idx = mask.nonzero()[:MAX_SHOWN].reshape(-1).tolist()
        return tuple(
            Mismatch(
                index=_fmt_index(i, shape, origin),
                expected=_hex(int(e_bits[i]), width),
                actual=_hex(int(a_bits[i]), width),
            )
            for i in idx
        )

    # One cause, one finding: NaN positions that differ beside ordinary value mismatches are part
    # of the same wrong values (data read from the wrong place holds NaN codes too), so they are
    # counted in the VALUE_MISMATCH; NAN_MISMATCH is for a tensor whose only fault is NaN handling.
    nan_bad_mask = e_nan != a_nan
    # Bit-exact (ulp 0), any other pattern is a mismatch (``_ordered`` is one-to-one): distances
    # are worked out only for an ulp budget, or for a finding's greatest one (most outputs that get
    # here differ only in NaN payloads, which are no mismatch).
    dist = (_ordered(e_bits, width) - _ordered(a_bits, width)).abs() if policy.ulp else None
    bad_mask = ~(e_nan | a_nan) & ((dist > policy.ulp) if dist is not None else (e_bits != a_bits))
    if keep is not None:
        nan_bad_mask &= ~keep
        bad_mask &= ~keep
    n_nan, n = int(nan_bad_mask.sum()), int(bad_mask.sum())
    if not n:
        if not n_nan:
            return []
        sample = shown(nan_bad_mask)
        return [
            ctx.finding(
                name,
                "nan",
                kind=Kind.NAN_MISMATCH,
                mismatches=sample,
                count=n_nan,
                total=total,
                message=f"{name}: NaN positions differ at {n_nan} / {total} elements ({100.0 * n_nan / total:.1f}%);"
                f" first at {list(sample[0].index)} (expected {sample[0].expected}, got {sample[0].actual})"
                f"{note}",
            )
        ]
    if dist is None:
        dist = (_ordered(e_bits, width) - _ordered(a_bits, width)).abs()
    masked = torch.where(bad_mask, dist, torch.zeros_like(dist))
    worst = int(masked.argmax())
    worst_dist = int(masked[worst])
    e_mag = e_bits.to(torch.int64) & ((1 << (width - 1)) - 1)
    # Flushing happens on the f32 product, which may round up to the smallest
    # normal in bf16: count that value as "where the exact result is subnormal".
    subnormal = (e_mag > 0) & (e_mag <= _MIN_NORMAL_BITS[exp.dtype])
    only_subnormal = not n_nan and not bool((bad_mask & ~subnormal).any())
    detail = " (every mismatch is where the exact result is subnormal)" if only_subnormal else ""
    nan_note = f"; NaN positions differ at {n_nan} more" if n_nan else ""
    return [
        ctx.finding(
            name,
            "subnormal" if only_subnormal else "value",
            kind=Kind.SUBNORMAL_FLUSH if only_subnormal else Kind.VALUE_MISMATCH,
            mismatches=shown(bad_mask | nan_bad_mask),
            count=n + n_nan,
            total=total,
            max_ulp=worst_dist,
            message=f"{name}: Mismatched elements: {n + n_nan} / {total} ({100.0 * (n + n_nan) / total:.1f}%);"
            f" greatest ulp distance {worst_dist} at {list(_fmt_index(worst, shape, origin))}"
            f" (expected {_hex(int(e_bits[worst]), width)}, got {_hex(int(a_bits[worst]), width)}){detail}"
            f"{nan_note}{note}",
        )
    ]


def _exact_findings(
    ctx: Context, name: str, exp: torch.Tensor, act: torch.Tensor, skip: torch.Tensor | None, origin: int = 0
) -> list[Finding]:
    e = exp.reshape(-1)
    a = act.reshape(-1).to(e.device)
    # Only outputs whose bytes differ get here (``_differs``).
    differ = e != a
    keep = _skip_mask(skip, e.numel(), e.device)
    if keep is not None:
        differ &= ~keep
    n, total, shape = int(differ.sum()), e.numel(), tuple(exp.shape)
    if not n:
        return []
    bad = differ.nonzero()[:MAX_SHOWN].reshape(-1).cpu()
    shown = tuple(
        Mismatch(index=_fmt_index(int(i), shape, origin), expected=str(int(e[i])), actual=str(int(a[i])))
        for i in bad[:MAX_SHOWN]
    )
    return [
        ctx.finding(
            name,
            "value",
            mismatches=shown,
            count=n,
            total=total,
            message=f"{name}: Mismatched elements: {n} / {total} ({100.0 * n / total:.1f}%);"
            f" first at {list(shown[0].index)} (expected {shown[0].expected}, got {shown[0].actual})"
            f"{_skipped_note(keep)}",
        )
    ]


def _row_story(exp: list[int], act: list[int], count: int) -> str:
    """What is wrong with one compacted row, in a few words: slots missing from its prefix, slots
    that should not be there, a non-(-1) value in its tail."""
    missing = Counter(exp[:count]) - Counter(act[:count])
    extra = Counter(act[:count]) - Counter(exp[:count])
    parts = []
    if missing:
        parts.append(f"missing {', '.join(str(v) for v in list(missing.elements())[:3])}")
    if extra:
        parts.append(f"unexpected {', '.join(str(v) for v in list(extra.elements())[:3])}")
    tail = [(j, v) for j, v in enumerate(act[count:], start=count) if v != -1]
    if tail:
        parts.append(f"{tail[0][1]} at column {tail[0][0]} of the -1 tail")
    return "; ".join(parts) or "differs"


def _row_set_findings(
    ctx: Context, name: str, exp: torch.Tensor, act: torch.Tensor, counts: torch.Tensor, ok: torch.Tensor
) -> list[Finding]:
    """``ok``: each row's verdict (``rows_as_sets_equal``), some of them False."""
    bad = (~ok).nonzero().reshape(-1).cpu()
    n, total = int(bad.numel()), exp.shape[0]
    counts_l = counts.reshape(-1).cpu()
    shown = []
    for i in bad[:MAX_SHOWN].tolist():
        c = int(counts_l[i])
        shown.append(
            Mismatch(
                index=(i,), expected=f"{c} valid slots, then -1", actual=_row_story(exp[i].tolist(), act[i].tolist(), c)
            )
        )
    return [
        ctx.finding(
            name,
            "row_set",
            mismatches=tuple(shown),
            count=n,
            total=total,
            message=f"{name}: Mismatched rows: {n} / {total} ({100.0 * n / total:.1f}%), compared as multisets with a"
            f" -1 tail; first at [{shown[0].index[0]}] (expected {shown[0].expected}, got {shown[0].actual})",
        )
    ]


def compare(
    *,
    expected: Mapping[str, torch.Tensor | None],
    actual: Mapping[str, torch.Tensor | None],
    policy: Policy,
    ctx: Context,
    row_sets: Mapping[str, torch.Tensor] | None = None,
    skip: Mapping[str, torch.Tensor] | None = None,
    origin: Mapping[str, int] | None = None,
    loose: Mapping[str, torch.Tensor] | None = None,
) -> list[Finding]:
    """All differences between two output dicts, as findings (empty when equal). ``row_sets``:
    outputs compared in row-set mode (see the module docstring), name -> the expected count of
    each row's valid prefix; ``skip``: per output, a bool mask of elements not to compare;
    ``origin``: per output, the first row its tensors start at in the full one (indices are
    reported there); ``loose``: per float output, a bool mask of elements judged on NaN-ness and
    sign alone."""
    row_sets = row_sets or {}
    skip = skip or {}
    origin = origin or {}
    actual = _beside(expected, actual)
    for name, mask in (loose or {}).items():
        exp, act = expected.get(name), actual.get(name)
        if isinstance(exp, torch.Tensor) and isinstance(act, torch.Tensor) and exp.dtype in _BITS_VIEW:
            if exp.shape == act.shape == mask.shape and exp.dtype == act.dtype:
                expected = {**expected, name: _loose_bits(exp, mask)}
                actual = {**actual, name: _loose_bits(act, mask)}
    differs, row_ok = _differs(expected, actual, row_sets)
    findings: list[Finding] = []
    for name, exp in expected.items():
        act = actual.get(name)
        if exp is None and act is None:
            continue
        if exp is None or act is None or not isinstance(act, torch.Tensor):
            findings.append(
                ctx.finding(
                    name,
                    "missing",
                    message=f"{name}: expected {'a tensor' if exp is not None else 'nothing'},"
                    f" got {type(act).__name__}",
                )
            )
            continue
        if exp.shape != act.shape or exp.dtype != act.dtype:
            findings.append(_shape_finding(ctx, name, exp, act))
        elif not differs[name]:
            continue
        elif name in row_ok:
            findings.extend(_row_set_findings(ctx, name, exp, act, row_sets[name], row_ok[name]))
        elif exp.dtype in _BITS_VIEW:
            findings.extend(_float_findings(ctx, name, exp, act, policy, skip.get(name), origin.get(name, 0)))
        else:
            findings.extend(_exact_findings(ctx, name, exp, act, skip.get(name), origin.get(name, 0)))
    return findings


def _beside(
    expected: Mapping[str, torch.Tensor | None], actual: Mapping[str, torch.Tensor | None]
) -> Mapping[str, torch.Tensor | None]:
    """The actual outputs that a host oracle's expected ones are compared with, copied to the host
    together in one sync (``host_copies``), not one each as comparing them one by one would."""
    names = [
        name
        for name, exp in expected.items()
        if isinstance(exp, torch.Tensor)
        and isinstance(act := actual.get(name), torch.Tensor)
        and exp.device.type == "cpu"
        and act.device.type != "cpu"
    ]
    if not names:
        return actual
    return {**actual, **dict(zip(names, host_copies(*(actual[name] for name in names))))}


def _differs(
    expected: Mapping[str, torch.Tensor | None],
    actual: Mapping[str, torch.Tensor | None],
    row_sets: Mapping[str, torch.Tensor],
) -> tuple[dict[str, bool], dict[str, torch.Tensor]]:
    """Which outputs alike in shape and dtype differ at all, read in one host sync for the whole
    case (most cases differ nowhere, and a sync per output stops a run scaling with workers: issue
    29); and each row-set output's per-row verdict. Bytes are compared: for floats that is the
    bit-exact test (same bits, same NaNs), and an output that differs only within ``Policy.ulp``
    is then judged by its own check. Small outputs (a step's seventeen metadata tensors) share one
    flag per device (``differ_flag_any``); only where it is set are they told apart, in one more read."""
    names, flags, row_ok = [], [], {}
    together: dict[torch.device, list[str]] = {}
    for name, exp in expected.items():
        act = actual.get(name)
        if not isinstance(exp, torch.Tensor) or not isinstance(act, torch.Tensor):
            continue
        if exp.shape != act.shape or exp.dtype != act.dtype:
            continue
        if name in row_sets and exp.dim() == 2:
            row_ok[name] = rows_as_sets_equal(expected=exp, actual=act, counts=row_sets[name])
            flags.append(~row_ok[name].all())
        elif exp.device == act.device and exp.numel() * exp.element_size() <= TOGETHER_BYTES:
            together.setdefault(exp.device, []).append(name)
            continue
        else:
            flags.append(differ_flag(exp, act))
        names.append(name)
    groups = list(together.values())
    read = read_flags(flags + [differ_flag_any([(expected[n], actual[n]) for n in group]) for group in groups])
    out = dict(zip(names, read))
    hit = [name for group, differs in zip(groups, read[len(names) :]) for name in group if differs]
    out.update(dict.fromkeys((n for group in groups for n in group), False))
    out.update(zip(hit, read_flags([differ_flag(expected[n], actual[n]) for n in hit])))
    return out, row_ok
