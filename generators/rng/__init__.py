"""Counter-based, device-exact generation: the hash stream (hashing.py), a case's words as views and
windows of one fixed table of hashed words (pool.py), float bit patterns (bits.py), cache records
(records.py), block tables, writer inputs and slots (fill.py), top-k rows (topk.py) and a convert batch's
table and rows together (batch.py)."""
