"""The defaults every surface shares (plugin options, the command line, the starts and the probe): one
place each, in a module of the standard library alone, so that reading them loads nothing."""

from __future__ import annotations

# The embedded default: the generated mini Laguna in INT4 with its own INT4 draft on vLLM's CPU build
# (fixtures/contracts/mini-laguna-cpu-int4.toml); the unquantized lane is mini-laguna-cpu.
DEFAULT_CONTRACT = "mini-laguna-cpu-int4"
# The preflight collective probe's whole deadline, imports and rendezvous included (probe.probe_collectives).
PROBE_DEADLINE_S = 180.0
