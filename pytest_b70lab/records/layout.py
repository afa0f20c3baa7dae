"""The names of a sealed record's files: shared by the module that writes a seal, the one that derives its
record.json from its evidence, and the one that reads and verifies it (which must not import the writer)."""

from __future__ import annotations

REPRO = "repro"  # the lab's folder of sealed records, in its repository
SEAL_FILE = "SEAL.json"
RECORD_FILE = "record.json"
CONTRACT_FILE = "contract.toml"
SNAPSHOTS = "__snapshots__"
