"""Planted hang: a gather that never returns on 2-request batches.

With ``MLAFUZZ_TEST_HANG_MARK`` set, it first creates that file: a test then knows a worker is
inside the hanging call (the moment to kill or stop the run) without timing it.
"""

import os
import time
from pathlib import Path

from mlafuzz.kernels.torch_impl import gather_torch


def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    if batch_size == 2:
        mark = os.environ.get("MLAFUZZ_TEST_HANG_MARK")
        if mark:  # written whole, then renamed: a reader never sees it empty
            Path(mark + ".tmp").write_text(str(os.getpid()))
            os.replace(mark + ".tmp", mark)
        while True:
            time.sleep(1)
    gather_torch(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
