"""One case, the full path: calls (calls.py), the comparator (compare.py), the detectors beyond
values (detectors.py), the detector pipeline that names each check as a step (pipeline.py), the
full path itself (full.py), error-input contracts (contracts.py) and the
per-process session that loads implementations once (session.py)."""
