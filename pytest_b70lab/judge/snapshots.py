"""syrupy snapshots kept in a folder named by what they belong to (a teacher, a quality baseline)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Re-exported for the annotations of teacher and quality.baseline: syrupy is imported through here alone.
    from syrupy.extensions.json import JSONSnapshotExtension as JSONSnapshotExtension
    from syrupy.location import PyTestLocation


def json_extension_in(folder: str, label: str) -> type[JSONSnapshotExtension]:
    """syrupy's JSON extension writing into __snapshots__/<folder>/<test module>/ (syrupy relates a file to
    its test by the parent folder). Imported only where snapshots are recorded or checked."""
    from syrupy.extensions.json import JSONSnapshotExtension

    class InFolder(JSONSnapshotExtension):
        @classmethod
        def dirname(cls, *, test_location: PyTestLocation) -> str:
            default = Path(super().dirname(test_location=test_location))
            return str(default.parent / folder / default.name)

    InFolder.__name__ = f"{label}[{folder}]"
    return InFolder
