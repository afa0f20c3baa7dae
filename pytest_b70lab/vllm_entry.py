"""The recorded path of the engine's command line, `python -m pytest_b70lab.vllm_entry serve ...`: the code is
in_engine/entry.py. This module stays so that the command of committed evidence is the command run today."""

from __future__ import annotations

import sys

from pytest_b70lab.in_engine.entry import main

if __name__ == "__main__":
    sys.exit(main())
