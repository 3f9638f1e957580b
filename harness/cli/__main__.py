"""``python -m mlafuzz.harness.cli``: the ``mlafuzz`` command."""

import sys

from mlafuzz.harness.cli.main import main

sys.exit(main())
