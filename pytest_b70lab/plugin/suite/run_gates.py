"""Gates judged per start from its metrics and checkpoint tables, and over all fresh starts together, through
the catalogue."""

from __future__ import annotations

import pytest

from ...judge import catalogue
from .from_catalogue import gate_tests

pytestmark = pytest.mark.gates

# One test per gate of the catalogue held in this file (catalogue.RUN_GATES), made by from_catalogue.
globals().update(gate_tests(catalogue.RUN_GATES))
