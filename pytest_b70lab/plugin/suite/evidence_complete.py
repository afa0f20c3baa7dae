"""The evidence checks, per fresh start: it left complete evidence on disk, and nothing outlived or exposed it.

The promotion gates proper evaluate this evidence; these say it is all there: the start succeeded, every rank
answered the audit and has its own log, metrics were scraped before and after, every prompt produced the
contract's token count, teardown left no process behind, only its owner could reach the engine, and the
collective probe passed first. Each is a required subject of the verdict (`catalogue.EVIDENCE_CHECK_SCOPES`).
"""

from __future__ import annotations

import pytest

from ...judge import catalogue
from .from_catalogue import gate_tests

pytestmark = pytest.mark.gates

# One test per gate of the catalogue held in this file (catalogue.EVIDENCE), made by from_catalogue.
globals().update(gate_tests(catalogue.EVIDENCE))
