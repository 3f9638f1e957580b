"""Planted: gather_two_bugs' two bugs, and a CI cancel mid-run. With SIGTERM_AFTER_CALLS=N in the
environment, the Nth call sends SIGTERM to its own process, as a CI system cancelling the job does:
run --in-process, the run stops there (exit 143 unless a finding fails it), with a summary saying
so. Without the variable it is gather_two_bugs. The count is per process, kept on the function."""

import os
import signal

from mlafuzz.tests.support.planted.gather_two_bugs import gather as two_bugs


def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    gather.calls = getattr(gather, "calls", 0) + 1
    if gather.calls == int(os.environ.get("SIGTERM_AFTER_CALLS", "0")):
        os.kill(os.getpid(), signal.SIGTERM)
    two_bugs(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
