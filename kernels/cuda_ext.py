"""Build, load and call the CUDA kernels (kernels/csrc: kernels.cu, and ops.cpp, their torch binding).

Public API, with the exact SPEC.md / vLLM signatures:

- ``gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None,
  host_cache=None, host_row_ids=None, device_row_ids=None)``: SPEC section 4
  (cp_gather_and_upconvert with seq_starts) and 9.3 (the host tier); writes ``dst`` in place.
- ``writer(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="fp8_ds_mla", scale=None, *,
  revision=NEWEST)``: vLLM's ``concat_and_cache_mla`` for the fp8_ds_mla dtype (SPEC section 2);
  ``scale`` is ignored, as vLLM ignores it for this dtype; the keyword-only ``revision`` picks
  the contract revision's tile scale rule (SPEC section 7). The RoPE bytes are k_pe's 16-bit patterns copied as
  is, as vLLM and mlafuzz.oracles.codec do, also for an fp16 k_pe; ``writer_impl(...,
  convert_fp16_rope=True)`` rounds an fp16 k_pe to bf16 instead (RNE, NaN -> 0x7FC0).
- ``load_extension(*, verbose=False) -> BuildInfo``: JIT-build on first use (GPU machine), cached
  per process; the build folder is keyed by source, torch version, CUDA version and GPU arch. A
  build holds a lock the OS frees when its process dies and is renamed into place only when done.
  ``build_extension`` does the same for other sources (the planted bugs' kernels/mutants/csrc).
  The kernels and the torch binding are two translation units that compile side by side: the
  kernels include no torch header, which was most of a one-file build's 17-30 s.
- ``nvcc_compile_check(*, out_dir, arch="sm_90") -> list[Path]``: compile the sources to objects
  with nvcc and no GPU (CI); proves the real kernel and binding code compiles for the target arch.

The ops are registered as ``torch.ops.mlafuzz_fp8_ds_mla.{gather,writer}``. Knobs that are not
in the public signatures are reachable through ``gather_impl`` (``rows_per_warp`` 1/2/4/8,
``force_scalar``, ``stream_hints``) and ``writer_impl`` (``convert_fp16_rope``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import itertools
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from mlafuzz.kernels.checks import check_gather_args, check_gather_host_args, check_writer_args
from mlafuzz.kernels.revisions import NEWEST, check_revision, scale_rule

__all__ = [
    "BuildInfo",
    "EXTENSION_NAME",
    "SOURCES",
    "build_extension",
    "build_in_background",
    "cache_root",
    "extension_built",
    "gather",
    "gather_impl",
    "load_extension",
    "nvcc_compile_check",
    "nvcc_flags",
    "writer",
    "writer_impl",
]

_log = logging.getLogger(__name__)

EXTENSION_NAME = "mlafuzz_fp8_ds_mla"
CSRC = Path(__file__).parent / "csrc"
SOURCES = (CSRC / "kernels.cu", CSRC / "ops.cpp")  # the kernels; their torch binding

# Exactness flags: no fast math, keep subnormals, IEEE division/sqrt, no FMA contraction (the
# kernels also use __fmul_rn/__fdiv_rn explicitly, so these are belt and braces).
_EXACT_FLAGS = ("-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=false")

# The gather's tuning knobs (a run of consecutive rows per warp; streaming cache hints) and the
# defaults the public ``gather`` uses: the fastest of `mlafuzz bench --op gather --variants` on
# the H200 (see README "Performance").
GATHER_ROWS_CHOICES = (1, 2, 4, 8)
GATHER_ROWS_PER_WARP = 2  # gather_lab on the H200, full grid of 128-thread blocks: rows 2 0.92x copy, 1 and 4 0.91x
GATHER_STREAM_HINTS = False

# A process waits for another's build as long as the builder lives (see _build_lock); after this
# long it says whom it waits for.
_WAIT_WARN_S = 10.0
_attempts = itertools.count()  # names each build attempt's temp folder apart (see _build_into_place)
# flock keeps threads apart too, but on NFS Linux emulates it with per-process POSIX locks; these
# keep one process's threads apart wherever the cache lives (one per build folder).
_THREAD_LOCKS: dict[Path, threading.Lock] = {}


@dataclass(frozen=True)
class BuildInfo:
    """How the extension was obtained in this process: ``cold`` means it was compiled now (no
    cached build matched); ``seconds`` is the wall time of the build-or-load call."""

    cold: bool
    seconds: float
    path: Path
    arch: str


def _gencode(arch: str) -> str:
    num = arch.removeprefix("sm_")
    return f"-gencode=arch=compute_{num},code=sm_{num}"


def nvcc_flags(arch: str) -> list[str]:
    """nvcc flags shared by the JIT build and the CI compile check (torch adds its own defines
    such as -D__CUDA_NO_HALF_OPERATORS__ to the JIT build; the compile check adds them too)."""
    return ["-O3", _gencode(arch), *_EXACT_FLAGS, "-lineinfo"]


def _present_arch() -> str:
    if not torch.cuda.is_available():
        raise RuntimeError("mlafuzz CUDA extension: no CUDA device (torch.cuda.is_available() is False)")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _find_nvcc() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME:
        candidate = Path(CUDA_HOME) / "bin" / "nvcc"
        if candidate.exists():
            return str(candidate)
    return shutil.which("nvcc")


def cache_root() -> Path:
    """mlafuzz's own cache folder (its CUDA extension builds): MLAFUZZ_CACHE, else ~/.cache/mlafuzz.
    A CI job keeps it between runs (``mlafuzz warmup`` prints it)."""
    env = os.environ.get("MLAFUZZ_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mlafuzz"


def _build_key(arch: str, *, folders: Sequence[Path] = (CSRC,)) -> str:
    h = hashlib.sha256()
    for path in sorted(p for folder in folders for p in folder.iterdir()):
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    for part in (torch.__version__, str(torch.version.cuda), arch, sys.version.split()[0], *nvcc_flags(arch)):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _build_dir(*, name: str, sources: Sequence[Path], include_dirs: Sequence[Path], arch: str) -> Path:
    folders = tuple(dict.fromkeys((*(s.parent for s in sources), *include_dirs)))
    return cache_root() / f"{'ext' if name == EXTENSION_NAME else name}-{_build_key(arch, folders=folders)}"


def extension_built() -> bool:
    """Whether this machine has the extension built for its GPU already (a warm start: loading it
    takes about a second); False without a GPU. Builds nothing."""
    try:
        arch = _present_arch()
    except RuntimeError:
        return False
    return (
        _build_dir(name=EXTENSION_NAME, sources=SOURCES, include_dirs=(), arch=arch) / f"{EXTENSION_NAME}.so"
    ).exists()


def build_in_background(on_done: Callable[[BuildInfo | None, BaseException | None], None]) -> threading.Thread:
    """Build and load the extension (``load_extension``) in a daemon thread, so that a run's start
    (imports, workers spawning, Triton compiles of the ops that need no extension) goes on beside
    nvcc; ``on_done(info, error)`` hears the outcome. Worker processes that need the extension
    meanwhile wait on the build lock (``_build_lock``) and load what this thread built: it is built
    once either way, and a run that ends mid-build leaves nothing a later run waits on."""

    def run() -> None:
        try:
            info = load_extension()
        except BaseException as exc:  # reported, not raised: the thread has no caller
            on_done(None, exc)
            return
        on_done(info, None)

    thread = threading.Thread(target=run, name="mlafuzz-cuda-ext-build", daemon=True)
    thread.start()
    return thread


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def _build_lock(build_dir: Path) -> Iterator[None]:
    """Hold the flock of ``<build_dir>.lock``, which makes builds of ``build_dir`` one at a time
    across threads and processes. The OS releases it when its holder dies, so a killed build never
    wedges a later one (torch's own ``lock`` file, which a waiter polls for with no timeout, is
    left behind by a killed build). The file holds its holder's pid, for the waiter's warning."""
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    path = build_dir.with_name(f"{build_dir.name}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # never deleted: a waiter may hold it open
    try:
        start = time.monotonic()
        while not _try_flock(fd):
            if time.monotonic() - start < _WAIT_WARN_S:
                time.sleep(0.05)
                continue
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            _log.warning(
                "mlafuzz CUDA extension: waiting %.0f s so far for process %s's build of %s (it holds %s)",
                time.monotonic() - start,
                holder,
                build_dir.name,
                path,
            )
            fcntl.flock(fd, fcntl.LOCK_EX)  # the holder is alive: it ends its build or dies
            break
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


def _build_into_place(
    *, name: str, sources: Sequence[Path], include_dirs: Sequence[Path], arch: str, build_dir: Path, verbose: bool
) -> None:
    """Under the build lock: compile into a folder of this attempt's own and rename it to
    ``build_dir`` only when torch's build returned, so ``build_dir`` holds a complete .so or does
    not exist. What builds whose process died left (their temp folders; a final folder without its
    .so, with torch's stale ``lock`` in it) goes first: this process holds the only real lock."""
    if _find_nvcc() is None:
        raise RuntimeError("mlafuzz CUDA extension: nvcc not found (set CUDA_HOME or add it to PATH)")
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        raise RuntimeError("mlafuzz CUDA extension: ninja not found (pip install ninja)")
    for stale in (build_dir, *build_dir.parent.glob(f"{build_dir.name}.tmp-*")):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = build_dir.with_name(f"{build_dir.name}.tmp-{os.getpid()}-{next(_attempts)}")
    tmp.mkdir()
    major, minor = arch.removeprefix("sm_")[:-1], arch[-1]
    try:
        with _env("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}"):
            built = Path(
                cpp_extension.load(
                    name=name,
                    sources=[str(s) for s in sources],
                    extra_cflags=["-O3"],
                    extra_cuda_cflags=nvcc_flags(arch),
                    extra_include_paths=[str(d) for d in include_dirs],
                    build_directory=str(tmp),
                    is_python_module=False,
                    verbose=verbose,
                )
            )
        # torch names a second build of ``name`` in one process (a retry: its folder differs)
        # ``name_v1``; the final folder always holds ``name.so``.
        built.replace(tmp / f"{name}.so")
        os.replace(tmp, build_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def build_extension(
    *, name: str, sources: Sequence[Path], include_dirs: Sequence[Path] = (), verbose: bool = False
) -> BuildInfo:
    """Build (first time on this machine) and load the torch extension ``name`` from ``sources``
    (ninja compiles them in parallel) with the exact flags; the build folder is keyed by the files
    of the sources' folders and of
    ``include_dirs``, the torch, CUDA and Python versions and the GPU arch. A built one loads
    without nvcc or ninja. Raises RuntimeError with a one-line message when there is no CUDA
    device, or when it must build and there is no nvcc or no ninja."""
    arch = _present_arch()
    build_dir = _build_dir(name=name, sources=sources, include_dirs=include_dirs, arch=arch)
    so = build_dir / f"{name}.so"
    t0 = time.perf_counter()
    cold = False
    if not so.exists():
        with _THREAD_LOCKS.setdefault(build_dir, threading.Lock()), _build_lock(build_dir):
            if not so.exists():  # else another thread or process built it while this one waited
                _build_into_place(
                    name=name,
                    sources=sources,
                    include_dirs=include_dirs,
                    arch=arch,
                    build_dir=build_dir,
                    verbose=verbose,
                )
                cold = True
    # After a build its .so is loaded already (cpp_extension.load loaded it from the temp folder);
    # the renames kept its inode, and dlopen hands back an object already loaded from the same
    # file, so this registers nothing twice.
    torch.ops.load_library(str(so))
    info = BuildInfo(cold=cold, seconds=time.perf_counter() - t0, path=so, arch=arch)
    _log.info(
        "mlafuzz CUDA extension %s %s in %.1f s (%s)", name, "built" if cold else "loaded", info.seconds, info.path
    )
    return info


@functools.cache
def load_extension(*, verbose: bool = False) -> BuildInfo:
    """Build (first time on this machine) and load the extension; cached for the process.

    Raises RuntimeError with a one-line message when there is no CUDA device, no nvcc or no
    ninja."""
    return build_extension(name=EXTENSION_NAME, sources=SOURCES, verbose=verbose)


def _ops():
    load_extension()
    return torch.ops.mlafuzz_fp8_ds_mla


def _as_bytes(cache: torch.Tensor) -> torch.Tensor:
    """An fp8 (or other 1-byte) view of the cache is the same bytes: view it as uint8."""
    if cache.dtype != torch.uint8 and cache.element_size() == 1:
        return cache.view(torch.uint8)
    return cache


def _require_cuda(name: str, t: torch.Tensor) -> None:
    if not (isinstance(t, torch.Tensor) and t.is_cuda):
        raise ValueError(f"{name} must be a CUDA tensor")


def gather_impl(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
    host_cache: torch.Tensor | None = None,
    host_row_ids: torch.Tensor | None = None,
    device_row_ids: torch.Tensor | None = None,
    *,
    rows_per_warp: int = GATHER_ROWS_PER_WARP,
    force_scalar: bool = False,
    stream_hints: bool = GATHER_STREAM_HINTS,
) -> None:
    """``gather`` with the kernel's tuning knobs exposed (tests and benchmarks)."""
    _require_cuda("src_cache", src_cache)
    # The host checks run here, in Python, before the op: an exception raised by TORCH_CHECK
    # inside this extension was seen to crash the process on the H200 image (torch 2.11) when
    # its message formats integers, so the C++ checks stay only as a backstop.
    check_gather_args(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
    if check_gather_host_args(src_cache, host_cache, host_row_ids, device_row_ids):
        assert host_cache is not None
        if host_cache.numel() and not host_cache.is_pinned():  # the kernel reads it in place from the device
            raise ValueError("host_cache must be pinned CPU memory (tensor.pin_memory())")
        host_cache = host_cache.view(torch.uint8)
    if rows_per_warp not in GATHER_ROWS_CHOICES:
        raise ValueError(f"rows_per_warp={rows_per_warp!r} must be one of {GATHER_ROWS_CHOICES}")
    _ops().gather(
        _as_bytes(src_cache),
        dst,
        block_table,
        workspace_starts,
        int(batch_size),
        seq_starts,
        int(rows_per_warp),
        bool(force_scalar),
        bool(stream_hints),
        host_cache,
        host_row_ids,
        device_row_ids,
    )


def gather(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
    host_cache: torch.Tensor | None = None,
    host_row_ids: torch.Tensor | None = None,
    device_row_ids: torch.Tensor | None = None,
) -> None:
    """SPEC section 4: dst[ws[b] + j] = dequant(record at position seq_starts[b] + j of request
    b); the last request's rows run to dst.size(0). Writes dst in place. With the host tier
    (SPEC 9.3), a position's slot picks a device row or a row of the pinned host cache. Host-side
    checks only (dtypes, shapes, devices, table/ws/seq_starts lengths >= batch_size, the host
    tier's three arguments); see gather_op in the .cu for the device-side preconditions it does
    not check."""
    gather_impl(
        src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, host_cache, host_row_ids, device_row_ids
    )


def writer_impl(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    convert_fp16_rope: bool = False,
    revision: str = NEWEST,
) -> None:
    """``writer`` with the RoPE knob exposed: ``convert_fp16_rope=True`` stores an fp16 k_pe as
    its value rounded to bf16 (RNE, NaN -> 0x7FC0) instead of its raw 16-bit pattern."""
    check_revision(revision)
    _require_cuda("kv_cache", kv_cache)
    check_writer_args(kv_c, k_pe, kv_cache, slot_mapping, "fp8_ds_mla")  # see gather_impl
    if slot_mapping.dtype != torch.int64:
        raise TypeError(f"slot_mapping.dtype={slot_mapping.dtype} must be torch.int64")
    _ops().writer(kv_c, k_pe, _as_bytes(kv_cache), slot_mapping, bool(convert_fp16_rope), scale_rule(revision))


def writer(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "fp8_ds_mla",
    scale: torch.Tensor | None = None,
    skip_scale: bool = False,
    *,
    revision: str = NEWEST,
) -> None:
    """vLLM's concat_and_cache_mla for kv_cache_dtype="fp8_ds_mla" (SPEC section 2): per token
    with slot >= 0, per 128-tile scale = max(amax / 448, FLT_MIN) under revision 2026-07, or
    2**ceil(log2(max(amax / 448, 1e-4f))) (exact, on the bits) under 2026-09 (SPEC section 7);
    codes = satfinite e4m3(x / scale), RoPE = k_pe's raw 16-bit patterns. ``scale`` is accepted
    and ignored (vLLM ignores it for this dtype), and so is ``skip_scale`` (vLLM 0.33.0: it skips
    only the division by ``scale``); any other kv_cache_dtype, or an unknown
    ``revision``, raises ValueError before anything runs."""
    if kv_cache_dtype != "fp8_ds_mla":
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r}: only 'fp8_ds_mla' is supported")
    del scale, skip_scale
    writer_impl(kv_c, k_pe, kv_cache, slot_mapping, revision=revision)


def _cpu_torch_workarounds() -> list[str]:
    """A CPU build of torch ships c10/cuda headers but not the generated
    c10/cuda/impl/cuda_cmake_macros.h (it only sets C10_CUDA_BUILD_SHARED_LIBS, which matters for
    Windows symbol export); tell CUDAMacros.h to skip it when it is absent."""
    from torch.utils import cpp_extension

    generated = "c10/cuda/impl/cuda_cmake_macros.h"
    if any((Path(p) / generated).exists() for p in cpp_extension.include_paths()):
        return []
    return ["-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE"]


def _torch_cxx_std() -> str:
    """The C++ standard torch's JIT builder passes to nvcc (c++17 up to about torch 2.9, c++20
    after); the compile check uses the same so that it sees what the real build sees."""
    import inspect

    from torch.utils import cpp_extension

    return "c++20" if "-std=c++20" in inspect.getsource(cpp_extension) else "c++17"


def nvcc_compile_check(
    *,
    out_dir: Path,
    arch: str = "sm_90",
    std: str | None = None,
    timeout_s: float = 300.0,
    sources: Sequence[Path] = SOURCES,
    name: str = EXTENSION_NAME,
    include_dirs: Sequence[Path] = (),
) -> list[Path]:
    """Compile ``sources`` (default: kernels/csrc's kernels.cu and ops.cpp) to object files with
    nvcc (which hands a .cpp to the host compiler), side by side, without a GPU, against the
    installed torch headers (a CPU build of torch ships the CUDA headers too), with the JIT build's
    flags. ``std`` defaults to the standard the installed torch builds extensions with. Returns the
    objects' paths, in the sources' order; raises RuntimeError (the compiler's output included) on
    the first failure."""
    nvcc = _find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (set CUDA_HOME or add it to PATH)")
    from torch.utils import cpp_extension

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    includes = [*map(str, include_dirs), *cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    common = [
        nvcc,
        "-c",
        f"-std={std or _torch_cxx_std()}",
        *nvcc_flags(arch),
        *cpp_extension.COMMON_NVCC_FLAGS,
        "-Xcompiler",
        "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        f"-DTORCH_EXTENSION_NAME={name}",
        *_cpu_torch_workarounds(),
        *(f"-I{p}" for p in includes),
    ]
    jobs = []
    for source in sources:
        obj = out_dir / f"{source.stem}.{arch}.o"
        cmd = [*common, str(source), "-o", str(obj)]
        jobs.append((cmd, obj, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    failure = None
    for cmd, obj, proc in jobs:
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        if failure is None and (proc.returncode != 0 or not obj.exists()):
            failure = f"nvcc failed (rc={proc.returncode}): {' '.join(cmd)}\n{output}"
    if failure is not None:
        raise RuntimeError(failure)
    return [obj for _, obj, _ in jobs]
