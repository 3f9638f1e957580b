"""Tests of the edges: the CLI, the pytest plugin, bench, contract revisions end to end, a toy op added in one line."""
