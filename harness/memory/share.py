"""Sharing one GPU's memory among the worker processes on it.

A case on a huge cache (SPEC 8: record offsets past 2**31 and 2**32 bytes)
holds several copies of that cache at its peak: the case's own, the call's
working copy, the rerun's and the oracle's, about 5x 4.3 GB. Eight workers
each on such a case at once do not fit on one GPU, and with ``--size large``
one case in 20 is huge, so at 1,000 cases/s they would meet all the time.
And PyTorch's caching allocator keeps what a process freed reserved for that
process, so a worker that once ran a huge case holds its peak for good.

So a case whose cache head is at least HUGE_BYTES runs only while its worker
holds one of a few slots per GPU (file locks, so every process on the
machine, of every run, counts against the same slots), and hands the cached
memory back (``torch.cuda.empty_cache``) before it lets the slot go. The
slots per GPU: its memory over SLOT_BYTES, at least 1. Every other case runs
unhindered; a worker that ends a case holding more than TRIM_BYTES reserved
hands that back too. Only the scheduling changes: the cases, their bytes and
their verdicts are the same.

A process whose CUDA memory goes through another allocator (the red-zone allocator of
``--redzone`` and of ``mutants --device cuda``: harness/memory/redzone.py) has no cache to hand
back, and torch's cache queries raise under it ("CUDAPluggableAllocator does not yet support
getDeviceStats"): its share takes turns in the slots but never asks or trims (``caching=False``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any, Iterator

from mlafuzz.oracles.formats import table as formats

RECORD_BYTES = formats.get("fp8_ds_mla").record_bytes  # the paged caches' records (nvfp4's are smaller)
HUGE_BYTES = 1 << 30  # a cache head this large is a huge case (the large preset's are 2.1 and 4.3 GB)
SLOT_BYTES = 40 << 30  # a huge case's peak is about 5x its 4.3 GB cache, with margin
TRIM_BYTES = 8 << 30  # reserved memory a worker hands back after any case


def head_bytes(spec: Any) -> int:
    """Bytes of the all-zero head below a case's blocks (0 for a spec without a paged cache)."""
    paging = getattr(spec, "paging", None)
    if paging is None:
        return 0
    return int(paging.base_block) * int(paging.block_size) * RECORD_BYTES


class GpuShare:
    """The huge-case slots of one GPU (``device``: "cuda:N"), for the worker processes on it."""

    def __init__(
        self, device: str, *, lock_dir: Path | None = None, slots: int | None = None, caching: bool = True
    ) -> None:
        import torch

        dev = torch.device(device)
        props = torch.cuda.get_device_properties(dev)
        # Keyed by the physical GPU, not the index: CUDA_VISIBLE_DEVICES renumbers them per run.
        name = str(getattr(props, "uuid", "") or f"index{dev.index}")
        self._device = dev
        self._caching = caching  # torch's caching allocator serves this process (not a pluggable one)
        self._slots = slots or max(1, int(props.total_memory) // SLOT_BYTES)
        self._stem = f"mlafuzz-gpu-{zlib.crc32(name.encode()):08x}"
        self._dir = lock_dir or Path(tempfile.gettempdir())

    @property
    def slots(self) -> int:
        return self._slots

    @contextlib.contextmanager
    def case(self, spec: Any) -> Iterator[None]:
        """Run one case: in a slot if it is huge, with the memory it cached handed back after."""
        import torch

        if head_bytes(spec) < HUGE_BYTES:
            yield
            if self._caching and torch.cuda.memory_reserved(self._device) > TRIM_BYTES:
                torch.cuda.empty_cache()
            return
        with slot(self._dir, self._stem, self._slots):
            try:
                yield
            finally:
                if self._caching:
                    torch.cuda.empty_cache()


@contextlib.contextmanager
def slot(lock_dir: Path, stem: str, slots: int) -> Iterator[int]:
    """Hold one of ``slots`` exclusive file locks named ``stem``-K in ``lock_dir``: the first free
    one, else wait for one picked by this process id. Yields K. A process that dies holding one
    releases it (the kernel drops its locks)."""
    fds = []
    try:
        for k in range(slots):
            fd = os.open(lock_dir / f"{stem}-{k}.lock", os.O_RDWR | os.O_CREAT, 0o666)
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            yield k
            return
        k = os.getpid() % slots
        fcntl.flock(fds[k], fcntl.LOCK_EX)
        yield k
    finally:
        for fd in fds:
            os.close(fd)  # closing drops the lock
