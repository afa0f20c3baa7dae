"""Gates judged per fresh start and per tensor-parallel rank, from the per-rank audits. Each judges through the
catalogue (pytest_b70lab/judge/catalogue.py: what it reads, when it applies), as the in-process judge does."""

from __future__ import annotations

import pytest

from ...judge import catalogue
from .from_catalogue import gate_tests

pytestmark = pytest.mark.gates

# One test per gate of the catalogue held in this file (catalogue.RANKS), made by from_catalogue.
globals().update(gate_tests(catalogue.RANKS))
