"""The defaults every surface shares (plugin options, the command line, the starts and the probe): one
place each, in a module of the standard library alone, so that reading them loads nothing."""

from __future__ import annotations

# The embedded default: the generated mini Laguna on vLLM's CPU build (fixtures/contracts/mini-laguna-cpu.toml).
DEFAULT_CONTRACT = "mini-laguna-cpu"
# The preflight collective probe's whole deadline, imports and rendezvous included (probe.probe_collectives).
PROBE_DEADLINE_S = 180.0
