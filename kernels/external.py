"""Implementations outside the project: ``--impl OP=package.module:attr`` or ``OP=path/to/file.py:attr``.

The callable is imported when it is resolved, so a mistake surfaces as one
line before any case runs; its signature says which optional SPEC features it
has (``adapt_signature``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from mlafuzz.kernels.entry import ImplEntry, ImplError


def _check_callable(obj: object, ref: str) -> Callable:
    if not callable(obj):
        raise ImplError(f"--impl {ref}: {type(obj).__name__} object is not callable")
    return obj  # type: ignore[return-value]


USER_MODULE_PREFIX = "mlafuzz_user_"


def _user_module_name(path: Path) -> str:
    """One name per file, the same in every process (workers and replay load it again by path), so
    two ``--impl`` files of one basename never share a module, and none can take one of ours."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"{USER_MODULE_PREFIX}{stem}_{digest}"


def _foreign_siblings(folder: str) -> dict[str, object]:
    """The modules other ``--impl`` files' folders gave ``sys.modules``: hidden while a file of
    ``folder`` loads, so its ``import helpers`` finds its own ``helpers.py``, not another's."""
    roots = {
        os.path.dirname(getattr(m, "__file__", None) or "")
        for n, m in list(sys.modules.items())
        if n.startswith(USER_MODULE_PREFIX)
    } - {folder, ""}
    found = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if not name.startswith(USER_MODULE_PREFIX) and any(file.startswith(root + os.sep) for root in roots):
            found[name] = module
    return found


def _load_from_path(path_text: str, attr: str, ref: str) -> Callable:
    """Load a user's file as ``python path.py`` would run it: its folder leads ``sys.path`` while
    it loads, so its sibling modules import. Afterwards the folder stays, at the end of ``sys.path``
    (a function may import a sibling lazily, as a script may), where a sibling named like a module
    mlafuzz imports later (``queue.py``) cannot shadow it."""
    path = Path(path_text)
    if not path.is_file():
        raise ImplError(f"--impl {ref}: file {path_text!r} does not exist")
    path = path.resolve()
    folder = str(path.parent)
    mod_name = _user_module_name(path)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ImplError(f"--impl {ref}: {path_text!r} is not a loadable Python file")
    module = importlib.util.module_from_spec(spec)  # a fresh load each time it is resolved, as a script runs
    hidden = _foreign_siblings(folder)
    for name in hidden:
        del sys.modules[name]
    sys.modules[mod_name] = module  # spawned workers re-resolve by path, to this same name
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file failed to import: say how, in one line
        del sys.modules[mod_name]
        raise ImplError(f"--impl {ref}: importing {path_text!r} failed: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(folder)
        if folder not in sys.path:
            sys.path.append(folder)
        for name, other in hidden.items():  # the first file's sibling keeps the bare name
            sys.modules[name] = other
    if not hasattr(module, attr):
        raise ImplError(f"--impl {ref}: {path_text!r} has no attribute {attr!r}")
    return _check_callable(getattr(module, attr), ref)


def _load_from_module(module_name: str, attr: str, ref: str) -> Callable:
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ImplError(f"--impl {ref}: cannot import module {module_name!r}: {type(exc).__name__}: {exc}") from None
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplError(f"--impl {ref}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return _check_callable(obj, ref)


def external_entry(op: str, ref: str, *, rejects: Iterable[str]) -> ImplEntry:
    """An entry for ``module:attr`` or ``path.py:attr``, loaded now so errors surface early."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ImplError(f"--impl {op}={ref}: expected a registered name, 'vllm', 'module:attr' or 'path.py:attr'")
    is_path = target.endswith(".py") or "/" in target or os.sep in target
    fn = _load_from_path(target, attr, ref) if is_path else _load_from_module(target, attr, ref)
    fn, caps = adapt_signature(op, fn)
    return ImplEntry(
        op=op,
        name=ref,
        loader=lambda device: fn,
        devices=frozenset({"cpu", "cuda"}),
        rejects=frozenset(rejects),
        description=f"external implementation {ref}",
        capabilities=caps,
        surfaces_from="opaque" if opaque(fn) else "signature",
    )


# --- optional surfaces (SPEC 7, 9.2, 9.3): what an implementation may be given besides the call ---


@dataclass(frozen=True, kw_only=True)
class Surface:
    """An optional surface of an op: a capability name (what the op row's ``needs``/``fit`` ask
    for) and the keywords that carry it (a signature that names all of them has it). ``in_call``:
    carried by the op's own call (gather's ``seq_starts``, always passed), so any implementation
    has it unless its signature is an older form the harness adapts."""

    op: str
    name: str
    keywords: tuple[str, ...]
    in_call: bool = False


GATHER_HOST_KEYWORDS = ("host_cache", "host_row_ids", "device_row_ids")  # the ``host_tier`` capability
# SPEC 9.2's caller-owned outputs: a signature that names both keywords (vLLM's convert, and its
# DCP peer-slot variant) gets them in some cases.
CALLER_OUT_KEYWORDS = ("out", "valid_counts_out")
# SPEC 10: the convert's arguments in vLLM's releases: the four DCP keywords (0.30.0) come together.
DCP_ARG_KEYWORDS = ("dcp_size", "dcp_rank", "cp_kv_cache_interleave_size", "prefill_workspace_rank_stride")

# Every optional surface, one row each: adding a surface is one row here (and its generator's
# ``needs``/``fit``). The header, ``--features`` and signature reading all read this table.
SURFACES: tuple[Surface, ...] = (
    Surface(op="gather", name="seq_starts", keywords=("seq_starts",), in_call=True),
    Surface(op="gather", name="host_tier", keywords=GATHER_HOST_KEYWORDS),
    Surface(op="convert", name="block_stride_rows", keywords=("BLOCK_STRIDE_ROWS",)),
    Surface(op="convert", name="compact_to_front", keywords=("COMPACT_TO_FRONT",)),
    Surface(op="convert", name="caller_out", keywords=CALLER_OUT_KEYWORDS),
    Surface(op="convert", name="idx_mapping", keywords=("idx_mapping",)),  # vLLM 0.33.0 on
    Surface(op="convert", name="dcp_args", keywords=DCP_ARG_KEYWORDS),  # vLLM 0.30.0 on
    Surface(op="dcp_peer", name="caller_out", keywords=CALLER_OUT_KEYWORDS),
    Surface(op="dcp", name="block_stride_rows", keywords=("BLOCK_STRIDE_ROWS",)),  # vLLM 0.29.0 on
    Surface(op="writer", name="skip_scale", keywords=("skip_scale",)),  # concat_and_cache_mla, vLLM 0.33.0 on
)


def surfaces(op: str) -> tuple[Surface, ...]:
    """The op's optional surfaces, in table order (none: an op without any)."""
    return tuple(s for s in SURFACES if s.op == op)


def declarable(op: str) -> tuple[str, ...]:
    """The surface names ``--features OP=...`` may declare: those passed by keyword."""
    return tuple(s.name for s in surfaces(op) if not s.in_call)


def _parameters(fn: Callable) -> Mapping[str, inspect.Parameter] | None:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and torch ops may hide their signature
        return None


def opaque(fn: Callable) -> bool:
    """Whether ``fn``'s signature cannot show which keywords it takes: hidden, or a ``**kwargs``
    (it might drop a keyword, so it proves nothing)."""
    params = _parameters(fn)
    return params is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def cannot_take(op: str, fn: Callable, names: Iterable[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(surface, its missing keywords) for each declared surface of ``names`` that ``fn``'s readable
    signature plainly cannot take (it lacks a keyword and has no ``**kwargs``); () for a signature
    that cannot show it."""
    if opaque(fn):
        return ()
    params = _parameters(fn) or {}
    rows = {s.name: s for s in surfaces(op)}
    missing = ((n, tuple(k for k in rows[n].keywords if k not in params)) for n in names if n in rows)
    return tuple((n, keys) for n, keys in missing if keys)


@dataclass(frozen=True, kw_only=True)
class SurfaceView:
    """What one implementation will and will not be given of its op's optional surfaces, and why
    (``source``: ``ImplEntry.surfaces_from``), for the run's header (reports/console.py words it)."""

    op: str
    impl: str
    given: tuple[str, ...]
    absent: tuple[str, ...]
    declared: tuple[str, ...]  # of ``given``, those the user declared (--features)
    source: str
    declarable: tuple[str, ...]  # what --features OP=... may name


def surface_view(entry: ImplEntry) -> SurfaceView | None:
    """``entry``'s optional surfaces, given and not (None: its op has none)."""
    rows = surfaces(entry.op)
    if not rows:
        return None
    return SurfaceView(
        op=entry.op,
        impl=entry.name,
        given=tuple(s.name for s in rows if s.name in entry.capabilities),
        absent=tuple(s.name for s in rows if s.name not in entry.capabilities),
        declared=tuple(s.name for s in rows if s.name in entry.declared),
        source=entry.surfaces_from,
        declarable=declarable(entry.op),
    )


def parse_features(texts: Iterable[str], *, ops: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``--features OP=NAME,...`` texts -> op -> the surfaces declared; a one-line ImplError for an
    op not among ``ops`` (the run's) or a name that is not one of the op's surfaces (listing the valid ones)."""
    known = tuple(ops)
    out: dict[str, tuple[str, ...]] = {}
    for text in texts:
        op, sep, names = text.partition("=")
        if not sep or not op:
            raise ImplError(f"--features {text!r}: expected OP=NAME,... (NAME: one of the op's optional surfaces)")
        if op not in known:
            raise ImplError(f"--features {text!r}: op {op!r} is not fuzzed in this run (ops: {', '.join(known)})")
        valid = declarable(op)
        given = tuple(dict.fromkeys(n.strip() for n in names.split(",") if n.strip()))
        bad = [n for n in given if n not in valid]
        if bad or not given:
            raise ImplError(
                f"--features {text!r}: op {op!r} has no optional surface {bad[0] if bad else ''!r}"
                f" (valid: {', '.join(valid) or 'none: the op has no optional surfaces'})"
            )
        out[op] = tuple(dict.fromkeys(out.get(op, ()) + given))
    return out


def adapt_signature(op: str, fn: Callable) -> tuple[Callable, frozenset[str]]:
    """Fit an external callable to SPEC's signature and say which optional surfaces it has.

    A surface passed by keyword (``SURFACES``) is had when the signature names all its keywords
    (a ``**kwargs`` proves nothing: it may drop them; the user declares such a wrapper's with
    ``--features``); the harness passes those keywords only to implementations that have them, so
    an older one is called as before. A gather with ``seq_lens`` and no ``seq_starts`` (the
    pre-#48642 signature) is wrapped to the new call and lacks ``seq_starts``: cases that need it
    are skipped and reported, not failed.
    """
    params = _parameters(fn)
    if op == "gather" and params is not None and "seq_starts" not in params and "seq_lens" in params:
        return adapt_old_gather(fn), frozenset()
    named = frozenset(
        s.name for s in surfaces(op) if s.in_call or (params is not None and all(k in params for k in s.keywords))
    )
    return fn, named


def adapt_old_gather(fn: Callable) -> Callable:
    """Wrap gather(src, dst, block_table, seq_lens, workspace_starts, batch_size) to the new signature."""

    def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
        import torch

        ws = workspace_starts[:batch_size].to(torch.int64)
        ends = torch.cat([ws[1:], ws.new_tensor([dst.shape[0]])])
        seq_lens = (ends - ws).to(torch.int32)
        return fn(src_cache, dst, block_table, seq_lens, workspace_starts, batch_size)

    return gather
