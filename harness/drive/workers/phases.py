"""The phase codes a worker publishes in shared memory (which part of its task it is in), read by
the parent to charge a death or a hang to that part."""

IDLE, VALID, CONTRACT, LOADING = 0, 1, 2, 3  # the part of a task a worker is in (shared with the parent)
# How long a worker may take to load an implementation (import it, check its signature) before its
# first case with it; the case's own --timeout starts after. An import of vLLM or Triton takes
# seconds, and charged to the first case of every fresh worker under a short --timeout it made a
# TIMEOUT, whose restart made the next one, and so on.
LOAD_SECONDS = 120.0
PHASES = {"valid": VALID}
