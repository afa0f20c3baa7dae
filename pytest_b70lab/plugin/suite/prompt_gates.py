"""Gates judged per fresh start and per prompt, from the streamed requests (teacher-exactness also from the
teacher snapshot in the gates folder's __snapshots__/, or --b70-teacher-snapshots), through the catalogue."""

from __future__ import annotations

import pytest

from ...judge import catalogue
from .from_catalogue import gate_tests

pytestmark = pytest.mark.gates

# One test per gate of the catalogue held in this file (catalogue.PROMPT_GATES), made by from_catalogue.
globals().update(gate_tests(catalogue.PROMPT_GATES))
