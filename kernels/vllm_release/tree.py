"""Build an importable ``vllm`` folder from a release's wheel: its op modules plus our stubs.

``build_tree(wheel=..., root=..., version=...)`` writes ``root/vllm/...`` and ``root/tree.json``
(each module's origin: copied whole, sliced to named functions, absent from this release, or our
stub), into a temporary folder renamed into place when complete, so an interrupted build leaves
nothing half-made behind. A wheel is a zip file; nothing else of it is unpacked.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mlafuzz.kernels.vllm_release.slice import slice_module
from mlafuzz.kernels.vllm_release.stubs import STUBS, version_module

__all__ = ["Module", "MODULES", "build_tree", "TreeError"]


class TreeError(ValueError):
    """The wheel cannot be read, or holds none of the op modules: one line."""


@dataclass(frozen=True, kw_only=True)
class Module:
    """A module the ops need: copied whole, or cut down to ``keep`` (its top-level names)."""

    path: str  # inside the wheel and the tree
    keep: tuple[str, ...] = ()  # () : the whole module
    why: str = ""


MODULES: tuple[Module, ...] = (
    Module(
        path="vllm/v1/attention/backends/mla/sparse_utils.py",
        why="the convert, the DCP filter and prepare_sparse_mla_safe_lengths (Triton)",
    ),
    Module(
        path="vllm/model_executor/layers/attention/mla_attention.py",
        keep=("plan_mla_context_chunks",),
        why="the packing chunk planner (pure Python; 0.28.0 on)",
    ),
    Module(path="vllm/model_executor/warmup/jit_warmup.py", why="the kernel launcher sparse_utils uses (0.30.0 on)"),
    Module(
        path="vllm/model_executor/warmup/jit_warmup_triton_helper.py",
        why="the Triton kernel class sparse_utils uses (0.30.0 on)",
    ),
    Module(path="vllm/utils/math_utils.py", why="cdiv, round_down"),
)


def _write(root: Path, path: str, text: str) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def build_tree(*, wheel: Path, root: Path, version: str) -> Path:
    """``root`` holding an importable ``vllm`` of ``wheel``'s op modules (rebuilt when present)."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise TreeError(f"{wheel}: not a readable wheel ({exc})") from None
    origins: dict[str, str] = {}
    tmp = Path(tempfile.mkdtemp(prefix=".tree-", dir=root.parent if root.parent.is_dir() else None))
    try:
        with archive:
            present = set(archive.namelist())
            for m in MODULES:
                if m.path not in present:
                    origins[m.path] = "absent from this release"
                    continue
                source = archive.read(m.path).decode()
                digest = hashlib.sha256(source.encode()).hexdigest()[:16]
                if m.keep and all(f"def {k}(" not in source for k in m.keep):
                    _write(tmp, m.path, f'"""mlafuzz: vLLM {version} has no {", ".join(m.keep)}."""\n')
                    origins[m.path] = f"absent from this release: {', '.join(m.keep)} (sha256 {digest})"
                    continue
                if m.keep:
                    header = f"# vLLM {version}'s {m.path}, cut down by mlafuzz to {', '.join(m.keep)}"
                    source = slice_module(source, m.keep, header=header)
                _write(tmp, m.path, source)
                origins[m.path] = f"{'sliced' if m.keep else 'copied'} from the wheel (sha256 {digest})"
        if not any(o.endswith(")") and not o.startswith("absent") for o in origins.values()):
            raise TreeError(f"{wheel}: holds none of the op modules ({', '.join(m.path for m in MODULES)})")
        for path, text in STUBS.items():
            if path not in origins:
                _write(tmp, path, text)
                origins[path] = "mlafuzz stub"
        _write(tmp, "vllm/__init__.py", version_module(version))
        origins["vllm/__init__.py"] = "mlafuzz stub: __version__"
        for folder in sorted({p.parent for p in tmp.rglob("*.py")}):
            if folder != tmp and not (folder / "__init__.py").exists():
                (folder / "__init__.py").write_text("")
        _write(tmp, "tree.json", json.dumps({"version": version, "wheel": wheel.name, "modules": origins}, indent=1))
        root.parent.mkdir(parents=True, exist_ok=True)
        if root.exists():
            shutil.rmtree(root)
        tmp.rename(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root
