"""Copy a real run's evidence into fixtures/evidence/NAME/ for the plugin's own tests.

Keeps each start's evidence.json (candidate and teacher), the checkpoint tables and the prompt set, drops the logs, and
replaces this machine's paths (the repository, the home folder, the private socket folder) with
placeholders before re-writing each file with a fresh digest: the bundle says nothing about where it was
recorded, and everything about what the engine did.

    .venv/bin/python scripts/record_evidence_bundle.py data/runs/<run> fixtures/evidence/mini-laguna-cpu
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.evidence import run_folder

REPO = Path(__file__).resolve().parents[1]


def anonymize(text: str) -> str:
    text = text.replace(str(REPO), "<repo>").replace(str(Path.home()), "<home>")
    text = text.replace(sys.prefix, "<venv>")
    return re.sub(re.escape(tempfile.gettempdir()) + r"/b70lab-[A-Za-z0-9_]+", "<socket dir>", text)


def copy_start(src: Path, dst: Path) -> None:
    raw = anonymize((src / evidence.FILENAME).read_text())
    record = evidence.Evidence.model_validate(json.loads(raw))
    evidence.write(record, dst)


def main(run: Path, out: Path) -> int:
    shutil.rmtree(out, ignore_errors=True)
    for kind, base in (("candidate", run), ("teacher", run / "teacher")):
        if kind == "teacher" and not base.exists():
            continue  # the teacher may have been recorded in another run
        for start in run_folder.read_starts(run, kind):  # validates every file first
            name = f"start-{start.start_index}"
            copy_start(base / name, (out / "teacher" if kind == "teacher" else out) / name)
    for name in (run_folder.TABLES_COPY, run_folder.PROMPTS_COPY):
        (out / name).write_text(anonymize((run / name).read_text()))
    leftover = [
        p for p in out.rglob("*") if p.is_file() and (str(REPO) in p.read_text() or str(Path.home()) in p.read_text())
    ]
    assert not leftover, f"machine paths left in {leftover}"
    print(f"wrote {out}: {sorted(str(p.relative_to(out)) for p in out.rglob('*.json'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
