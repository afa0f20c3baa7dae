"""`python -m pytest_b70lab.cli`: the command line without its console script."""

import sys

from . import main

sys.exit(main())
