"""The recorded path of the worker extension, `--worker-extension-cls pytest_b70lab.worker_ext.AuditExtension`:
the code is in_engine/worker_ext.py. This module stays so that the command of committed evidence is the
command run today."""

from pytest_b70lab.in_engine.worker_ext import AuditExtension

__all__ = ["AuditExtension"]
