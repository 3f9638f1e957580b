"""The GPU fast path, one optional room: the fused exact checks (convert.py, gather.py, writer.py),
their compiled launcher (launch.py), the IEEE helpers (ieee.py), the input fingerprints
(fingerprint.py), per-process and per-case state (state.py) and the path itself with its board
(path.py). It needs triton and a GPU; without it (or with the room deleted) every case takes the
full path, slower but with the same findings."""
