"""Planted bugs: the catalog (catalog.py) and their code (torch_bugs.py)."""
