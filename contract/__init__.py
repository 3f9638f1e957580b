"""The contract's facts as data, for every layer: torch-free, importing nothing of mlafuzz."""
