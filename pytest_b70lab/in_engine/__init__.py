"""Code that runs inside vLLM's own processes: the `vllm` command line (entry), the worker extension that
audits every rank, and the general plugins vLLM loads in each process (fixes, dflash_fix, observe,
draft_capture, faults, with the CPU emulation and the portable FP8 path they install).

Imports only the standard library, vLLM, torch and psutil (tests/unit/test_walls.py), and this file imports
nothing: a replay of evidence imports `observe.moments` through digests and must not load vLLM or torch.
The engine command records two paths outside this folder, `pytest_b70lab.vllm_entry` and
`pytest_b70lab.worker_ext.AuditExtension`: thin modules there keep committed evidence, teacher snapshots and
quality baselines valid (their command is part of what `b70lab evidence diff` compares).
"""
