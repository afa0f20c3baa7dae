"""The one base of the errors b70lab reports to a person rather than as a traceback."""

from __future__ import annotations


class LabError(Exception):
    """A bad input or a failed step whose message already says what was expected, what was seen and where
    to look: the command line prints it and exits 2; the plugin fails the test that met it with it alone.
    Each subclass also keeps the builtin it always was (ValueError for bad files, RuntimeError for a step that
    failed), so that callers catching those still do."""
