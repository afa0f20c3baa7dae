"""Sealed records: a promotion made into a self-contained folder under `repro/NAME/` that cannot change
unnoticed (every file's sha256 in SEAL.json, one digest over them all), carries its source state, launcher,
oracle and result, and can be re-judged from its own files and reproduced later (issue 35).

`store`: reading, listing and verifying seals; `seal`: writing one from a promoted run folder; `reproduce`:
whether this machine is the sealed one, and whether a new run reproduces the sealed result."""
