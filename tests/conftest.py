"""Shared by every test folder: this folder is on sys.path (pytest's prepend import mode puts a rootless
conftest's folder there), so the helpers beside it import by name (`from browser import ...`)."""
