"""Counter-based, device-exact generation: the hash stream (hashing.py), float bit patterns (bits.py),
cache records (records.py), block tables, top-k rows, writer inputs and slots (fill.py)."""
