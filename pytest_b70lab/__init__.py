"""pytest-b70lab: the B70 inference lab's promotion gates as pytest tests."""

# Loaded with the package, before any pytester run can drop modules from sys.modules: every error class,
# fresh or not, then derives from this one LabError, which the command line catches.
from . import errors as errors  # noqa: F401
