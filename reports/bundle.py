"""Repro bundles: one folder per finding bucket, replayable on any machine that can run the impl.

Layout: ``case.json`` (schema version, op, spec, seed, impl, policy, device,
the contract revision the finding was judged under),
``inputs.pt`` (the case's tensors on the CPU, read back with
``weights_only=True``; a cache at the top of a larger one as its blocks past
the zero ones, case.json's ``zero_blocks`` saying how many), ``finding.json``, ``env.json`` and ``replay.txt`` (the
one-line command). Files are written to a temporary name and renamed, so a
bundle is whole or absent.
"""

from __future__ import annotations

import io
import json
import platform
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mlafuzz.reports.atomic import atomic_write
from mlafuzz.reports.findings import Finding
from mlafuzz.reports.invocation import command

# 2: cases made on the device from counter-based streams; a cache at the top of a larger one is
# stored as its blocks past the zero ones (case.json "zero_blocks"). A version-1 bundle holds bytes of
# the old CPU generator, which this one cannot make again.
# 3: shuffled block tables and the writer's slots come from keyed permutations (rng/shuffle.py), not
# sorts of random words: a version-2 bundle's tables and slots are not what this mlafuzz makes.
BUNDLE_SCHEMA = 3


class BundleError(ValueError):
    """A bundle that is missing, malformed or tampered with (one line for the user)."""


@dataclass(frozen=True, kw_only=True)
class Bundle:
    path: Path
    op: str
    spec: dict[str, Any]
    seed: int
    impl: str
    device: str
    ulp: int
    rerun: bool
    contract: str | None
    finding: Finding
    inputs: dict[str, torch.Tensor]
    revision: str | None = None  # the contract revision (SPEC 7) to replay under; None: a bundle from before revisions
    timeout: float | None = None  # the run's per-case limit (a TIMEOUT bundle replays under it)
    features: tuple[str, ...] = ()  # optional surfaces the run declared its implementation takes (--features)


def env_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        from importlib.metadata import version

        info["mlafuzz"] = version("mlafuzz")
    except Exception:
        info["mlafuzz"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(gpu=props.name, sm=f"{props.major}.{props.minor}", gpu_count=torch.cuda.device_count())
    return info


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:80] or "finding"


def external_ref(ref: str) -> bool:
    """Whether an ``--impl`` reference names code outside mlafuzz (``module:attr``, ``path.py:attr``):
    the registry's own test (a registered name or ``vllm`` has no colon)."""
    return ":" in ref


def replay_command(path: Path | str, *, op: str | None = None, impl: str | None = None) -> str:
    """The one-line replay of the bundle at ``path``, quoted for a POSIX shell. An external
    ``impl`` is named with ``--impl``: replay imports no code on a bundle's word, so without it the
    line would exit 2. Paths stay as the run was given them (relative ones resolve from the run's
    working folder, where the line is printed), so the line runs as printed there."""
    parts = ["replay", str(path)]
    if op and impl and external_ref(impl):
        parts += ["--impl", f"{op}={impl}"]
    return command(*parts)


def write_bundle(
    *,
    root: Path,
    name: str,
    op: str,
    spec: dict[str, Any],
    seed: int,
    impl: str,
    device: str,
    ulp: int,
    rerun: bool,
    contract: str | None,
    finding: Finding,
    inputs: dict[str, torch.Tensor | None],
    extra: dict[str, Any] | None = None,
    revision: str | None = None,
    timeout: float | None = None,
    features: tuple[str, ...] = (),
) -> Path:
    """``revision``: the contract revision to replay under; default the one the finding was judged
    under. ``timeout``: the run's per-case limit (a TIMEOUT bundle replays under it). ``features``:
    the surfaces the run declared its implementation takes; a replay gives it them again."""
    path = root / slug(name)
    path.mkdir(parents=True, exist_ok=True)
    case = {
        "schema_version": BUNDLE_SCHEMA,
        "op": op,
        "spec": spec,
        "seed": seed,
        "impl": impl,
        "device": device,
        "policy": {"ulp": ulp},
        "rerun": rerun,
        "contract": contract,
        "revision": revision if revision is not None else finding.revision,
        **(extra or {}),
    }
    if timeout is not None:
        case["timeout"] = timeout
    if features:
        case["features"] = sorted(features)
    tensors = {k: v.detach().cpu() for k, v in inputs.items() if v is not None}
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    atomic_write(path / "inputs.pt", buffer.getvalue())
    atomic_write(path / "case.json", (json.dumps(case, indent=2, sort_keys=True) + "\n").encode())
    atomic_write(path / "finding.json", (json.dumps(finding.to_json(), indent=2, sort_keys=True) + "\n").encode())
    atomic_write(path / "env.json", (json.dumps(env_info(), indent=2, sort_keys=True) + "\n").encode())
    atomic_write(path / "replay.txt", (replay_command(path, op=op, impl=impl) + "\n").encode())
    return path


def _field(case: dict[str, Any], name: str, tp: type) -> Any:
    if name not in case:
        raise BundleError(f"case.json: missing field {name!r}")
    value = case[name]
    if not isinstance(value, tp) or (isinstance(value, bool) and tp is not bool):
        raise BundleError(f"case.json: {name}={value!r} must be of type {tp.__name__}")
    return value


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: malformed JSON: {exc}") from None


def read_case_json(path: Path) -> dict[str, Any]:
    """A bundle's case.json (BundleError when it has none or it is not a JSON object)."""
    path = Path(path)
    if not (path / "case.json").is_file():
        raise BundleError(f"bundle {str(path)!r} has no case.json")
    case = _json(path / "case.json")
    if not isinstance(case, dict):
        raise BundleError(f"{path / 'case.json'}: must hold a JSON object")
    return case


def read_bundle(path: Path) -> Bundle:
    path = Path(path)
    if not path.is_dir():
        raise BundleError(f"bundle {str(path)!r} is not a directory")
    for name in ("case.json", "inputs.pt", "finding.json"):
        if not (path / name).is_file():
            raise BundleError(f"bundle {str(path)!r} has no {name}")
    case = read_case_json(path)
    finding_data = _json(path / "finding.json")
    version = case.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and 0 < version < BUNDLE_SCHEMA:
        raise BundleError(
            f"case.json: schema_version={version}: this bundle was written by an older mlafuzz whose"
            " case generator made other bytes for the same spec and seed, so it cannot be replayed"
            f" bit-identically (this mlafuzz reads {BUNDLE_SCHEMA}); re-run the fuzz case to get"
            " a new bundle"
        )
    if version != BUNDLE_SCHEMA:
        raise BundleError(
            f"case.json: schema_version={version!r} is not supported (this mlafuzz reads {BUNDLE_SCHEMA})"
        )
    try:
        finding = Finding.from_json(finding_data)
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"finding.json: malformed finding: {exc}") from None
    inputs = _load_inputs(path / "inputs.pt")
    policy = case.get("policy") or {}
    timeout = case.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise BundleError(f"{path / 'case.json'}: timeout={timeout!r} must be a number of seconds > 0")
    return Bundle(
        path=path,
        op=_field(case, "op", str),
        spec=_field(case, "spec", dict),
        seed=_field(case, "seed", int),
        impl=_field(case, "impl", str),
        device=_field(case, "device", str),
        ulp=int(policy.get("ulp", 0)),
        rerun=bool(case.get("rerun", False)),
        contract=case.get("contract"),
        finding=finding,
        inputs=inputs,
        revision=_revision(case, finding),
        timeout=float(timeout) if timeout is not None else None,
        features=_features(case),
    )


def _features(case: dict[str, Any]) -> tuple[str, ...]:
    value = case.get("features", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BundleError(f"case.json: features={value!r} must be a list of surface names")
    return tuple(value)


def _load_inputs(path: Path) -> dict[str, torch.Tensor]:
    """inputs.pt's tensors, read with ``weights_only=True``: a file that holds anything else (pickled
    code in a tampered or foreign bundle) is refused in one line, never run."""
    try:
        with warnings.catch_warnings():  # torch's own advice on weights_only is not for this reader
            warnings.simplefilter("ignore")
            inputs = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        lines = [" ".join(line.split()) for line in str(exc).splitlines() if line.strip()]
        blocked = next((line for line in lines if "GLOBAL" in line), None)
        if blocked is not None:  # what weights_only refused, without torch's boilerplate around it
            raise BundleError(
                f"{path.name}: refused to load: it holds pickled objects, not only tensors "
                f"({blocked.rstrip('.')}); bundles are read with weights_only=True"
            ) from None
        first = (lines[0] if lines else "").split(". ")[0].rstrip(".")
        raise BundleError(f"{path.name}: not a readable tensor file ({type(exc).__name__}: {first[:160]})") from None
    if not isinstance(inputs, dict) or not all(isinstance(v, torch.Tensor) for v in inputs.values()):
        raise BundleError(f"{path.name}: must hold a dict of tensors")
    return inputs


def _revision(case: dict[str, Any], finding: Finding) -> str | None:
    value = case.get("revision", finding.revision)
    if value is not None and not isinstance(value, str):
        raise BundleError(f"case.json: revision={value!r} must be a string")
    return value
