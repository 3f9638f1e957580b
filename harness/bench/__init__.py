"""`mlafuzz bench`: kernel bandwidth (kernels.py) and the harness's cost per case (harness.py)."""
