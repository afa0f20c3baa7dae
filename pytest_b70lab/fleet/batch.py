"""`b70lab gates --fleet ADDRESS --contract A --contract B ...`: a batch of gate sessions (several lanes, a nightly
of every sealed contract) over a fleet's boxes. A session is one Ray task on one box, with all its starts there:
its run folder comes back to DIR/sessions/SESSION/run, checked file by file, and the driver judges it again from
its evidence with the in-process judge (nothing the box says of its own verdict is taken on trust; where the box's
session recorded another verdict, the row says so). DIR/batch.json keeps what was asked, the ledger DIR/fleet.json
every attempt, DIR/gates-batch.json and DIR/gates-batch-junit.xml the verdicts."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..contract import schema as contract_mod
from ..contract.schema import Contract
from ..errors import LabError
from ..evidence import host, run_folder
from ..evidence.record import EvidenceError
from ..judge.folder import headline_line, judge_folder
from . import driver
from .ledger import Ledger
from .shards import Shard
from .work import RUN_DIR, SESSION_JSON, SESSION_LOG, GateRehearsalWork, GateSessionWork

Progress = Callable[[str], None]
BATCH_JSON = "batch.json"  # what was asked: the address, every session's contract and digest
SESSIONS_DIR = "sessions"  # DIR/sessions/SESSION/: the box's folder, with the session's run folder in run/
CONTRACTS_DIR = "contracts"
RESULT_JSON = "gates-batch.json"
JUNIT = "gates-batch-junit.xml"
SCHEMA, VERSION = "b70lab.gates-batch", 1


class BatchError(LabError, RuntimeError):
    """A batch that cannot start or resume: an occupied folder, a plan that does not read back."""


@dataclass(frozen=True)
class Session:
    name: str  # "session-01": its folder under DIR/sessions/ and its key in the ledger
    contract: str
    digest: str

    def as_shard(self) -> Shard:
        return Shard(self.name, (self.contract,))


@dataclass
class SessionRow:
    session: str
    contract: str
    verdict: str  # pass, fail, or none (not judged: the session did not come back, or its folder does not read)
    verdict_line: str
    box: str | None = None
    host_class: str | None = None
    attempts: int = 0
    lost: list[str] | None = None  # each lost or failed attempt: "attempt N on BOX: ERROR"
    box_said: str | None = None  # where the box's own session recorded another verdict than the driver's
    folder: str | None = None  # the run folder, relative to DIR

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(contracts: Sequence[Contract]) -> list[Session]:
    width = max(2, len(str(len(contracts))))
    return [Session(f"session-{i:0{width}d}", c.name, c.digest) for i, c in enumerate(contracts, 1)]


def prepare(out: Path, contracts: Sequence[Contract], sessions: list[Session], asked: dict[str, Any]) -> None:
    """DIR/batch.json and each contract's TOML under DIR/contracts/; a BatchError where DIR holds anything."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise BatchError(f"{out} is not empty: a batch starts in a new folder (continue one with --resume {out})")
    (out / CONTRACTS_DIR).mkdir(parents=True, exist_ok=True)
    for s, c in zip(sessions, contracts, strict=True):
        (out / CONTRACTS_DIR / f"{s.name}.toml").write_text(contract_mod.to_toml(c))
    record = {
        "schema": SCHEMA,
        "version": VERSION,
        **asked,
        "sessions": [asdict(s) for s in sessions],
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    (out / BATCH_JSON).write_text(json.dumps(record, indent=1) + "\n")


def read_plan(out: Path) -> tuple[dict[str, Any], list[Session], list[Contract]]:
    """batch.json and its contracts, each held to the digest the plan recorded."""
    path = Path(out) / BATCH_JSON
    try:
        record = json.loads(path.read_text())
        if record.get("schema") != SCHEMA or record.get("version") != VERSION:
            raise ValueError(f"not a {SCHEMA} version {VERSION} document")
        sessions = [Session(**s) for s in record["sessions"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BatchError(f"{path} cannot be read back ({e}): not a gates batch's folder, or a damaged one") from e
    contracts = []
    for s in sessions:
        contract = contract_mod.load(Path(out) / CONTRACTS_DIR / f"{s.name}.toml")
        if contract.digest != s.digest:
            raise BatchError(
                f"{Path(out) / CONTRACTS_DIR / s.name}.toml reads as digest {contract.digest[:16]}, "
                f"{BATCH_JSON} recorded {s.digest[:16]}: it changed since the batch began"
            )
        contracts.append(contract)
    return record, sessions, contracts


def batch_id(out: Path) -> str:
    """The name a batch's sessions have on every box: the folder's name and a digest of its plan."""
    return f"{Path(out).name}-{hashlib.sha256((Path(out) / BATCH_JSON).read_bytes()).hexdigest()[:12]}"


def session_work(
    session: Session, contract: Contract, lab_dir: Path, pytest_args: Sequence[str] = ()
) -> GateSessionWork:
    return GateSessionWork(
        session.contract, contract_mod.to_toml(contract), contract.digest, str(lab_dir), tuple(pytest_args)
    )


def run(
    out: Path,
    address: str,
    sessions: list[Session],
    work_of: Callable[[Session], GateSessionWork | GateRehearsalWork],
    say: Progress,
    *,
    host_class: str | None = None,
) -> tuple[dict[str, driver.ShardResult], list[str]]:
    """Every session not yet finished (by the ledger, with its folder in place) on a box; (the results of those
    that finished in this call, the problems). The caller wrote the plan (prepare) or is resuming it."""
    out = Path(out)
    ledger = Ledger(out)
    todo = []
    for s in sessions:
        folder = out / SESSIONS_DIR / s.name
        if ledger.finished(s.name) is not None and folder.is_dir():
            say(f"fleet: {s.name} ({s.contract}) kept from the interrupted batch")
        elif folder.exists():
            raise BatchError(f"{folder} exists but the ledger has no finished attempt of {s.name}: move it away")
        else:
            todo.append(s)
    by_shard = {s.name: s for s in sessions}
    problems: list[str] = []
    results: dict[str, driver.ShardResult] = {}
    driver.connect(address)
    try:
        results = driver.run_shards(
            batch_id(out),
            [s.as_shard() for s in todo],
            lambda shard: work_of(by_shard[shard.name]),
            out,
            ledger,
            say,
            host_class,
            into=SESSIONS_DIR,
        )
    except driver.FleetError as e:
        problems.append(str(e))
    finally:
        driver.disconnect()
    return results, problems


def judge(out: Path, sessions: list[Session], teacher_snapshots: Path, say: Progress) -> list[SessionRow]:
    """A row per session, its verdict judged here from the run folder that came back."""
    out = Path(out)
    ledger = Ledger(out)
    rows = []
    for s in sessions:
        lost = [f"attempt {e.attempt} on {e.box or 'no box yet'}: {e.error}" for e in ledger.lost(s.name)]
        done = ledger.finished(s.name)
        row = SessionRow(s.name, s.contract, "none", "", attempts=ledger.attempts(s.name), lost=lost)
        run_dir = out / SESSIONS_DIR / s.name / RUN_DIR
        if done is None:
            row.verdict_line = f"not judged: {s.name} did not come back from the fleet" + (
                f" ({'; '.join(lost)})" if lost else ""
            )
            rows.append(row)
            continue
        row.box, row.host_class, row.folder = done.box, done.host_class, str(run_dir.relative_to(out))
        if not run_dir.is_dir():
            row.verdict_line = f"not judged: the gates session on {done.box} left no run folder ({_ended(run_dir)})"
            rows.append(row)
            continue
        rows.append(_judged(row, run_dir, s, teacher_snapshots))
        say(f"fleet: {s.name} ({s.contract}) on {row.box}: {row.verdict_line}")
    return rows


def _judged(row: SessionRow, run_dir: Path, s: Session, teacher_snapshots: Path) -> SessionRow:
    log = run_dir.parent / SESSION_LOG
    try:
        decision = judge_folder(run_dir, teacher_snapshots)
    except LabError as e:  # no evidence at all: the session stopped before its first start
        return _not_begun(row, run_dir, e, log)
    if decision.contract_digest != s.digest:
        row.verdict, row.verdict_line = (
            "fail",
            f"the run folder's contract is digest {(decision.contract_digest or 'none')[:16]}, the batch asked for "
            f"{s.digest[:16]}: not this session's contract ({run_dir})",
        )
        return row
    row.verdict = "pass" if decision.promotable else "fail"
    row.verdict_line = headline_line(decision, run_dir)
    classes = {host.start_class(e).label for e in _starts(run_dir)}
    row.host_class = " / ".join(sorted(classes)) if classes else row.host_class
    try:
        recorded, _ = run_folder.read_promotion(run_dir)
    except EvidenceError as e:
        row.box_said = f"the box's promotion.json does not read: {e}"
        return row
    if recorded is not None and recorded.get("promotable") != decision.promotable:
        row.box_said = (
            f"the box's session recorded promotable={recorded.get('promotable')}, judged here "
            f"promotable={decision.promotable} from the same evidence"
        )
    return row


def _not_begun(row: SessionRow, run_dir: Path, error: LabError, log: Path) -> SessionRow:
    """A session with no evidence to judge: failed where the box's session recorded why it could not begin (a
    recorded verdict is taken only when it is not promotable: nothing recorded may promote), else not judged."""
    where = f" (the box's pytest output: {log})" if log.exists() else ""
    try:
        recorded, _ = run_folder.read_promotion(run_dir)
    except EvidenceError:
        recorded = None
    blocked = (recorded or {}).get("blocked")  # promotion.json: the session's first failure, as one line
    if recorded is not None and recorded.get("promotable") is False and isinstance(blocked, str) and blocked:
        row.verdict, row.verdict_line = "fail", f"NOT PROMOTABLE (recorded on the box): {blocked}{where}"
    else:
        row.verdict_line = f"not judged: {error}{where}"
    return row


def _ended(run_dir: Path) -> str:
    """How the box's pytest ended, from the session's folder: its exit code, and where its output is."""
    folder = run_dir.parent
    try:
        code = json.loads((folder / SESSION_JSON).read_text())["returncode"]
    except (OSError, ValueError, KeyError, TypeError):
        code = "unknown"
    return f"pytest exited {code}; its output: {folder / SESSION_LOG}"


def _starts(run_dir: Path) -> list[Any]:
    try:
        return run_folder.read_starts(run_dir)
    except EvidenceError:
        return []


def write(out: Path, address: str, rows: list[SessionRow], problems: list[str]) -> Path:
    """DIR/gates-batch.json and the JUnit file beside it (one test per session)."""
    from xml.etree import ElementTree as ET

    document = {
        "schema": "b70lab.gates-batch-result",
        "version": 1,
        "fleet": address,
        "ledger": "fleet.json",
        "problems": problems,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "sessions": [r.as_dict() for r in rows],
    }
    root = ET.Element("testsuites")
    suite = ET.SubElement(
        root,
        "testsuite",
        name="b70lab.gates-batch",
        tests=str(len(rows)),
        failures=str(sum(r.verdict == "fail" for r in rows)),
        errors=str(sum(r.verdict == "none" for r in rows)),
        skipped="0",
    )
    for r in rows:
        case = ET.SubElement(suite, "testcase", classname="b70lab.gates-batch", name=f"{r.session}/{r.contract}")
        props = ET.SubElement(case, "properties")
        for k in ("box", "host_class", "attempts", "folder"):
            ET.SubElement(props, "property", name=k, value=str(getattr(r, k) or ""))
        if r.verdict == "fail":
            ET.SubElement(case, "failure", message=r.verdict_line).text = r.verdict_line
        elif r.verdict == "none":
            ET.SubElement(case, "error", message=r.verdict_line).text = r.verdict_line
    try:
        (Path(out) / RESULT_JSON).write_text(json.dumps(document, indent=1) + "\n")
        (Path(out) / JUNIT).write_text(ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")
    except OSError as e:
        raise BatchError(f"cannot write the batch's verdicts into {out}: {e.strerror or e}") from e
    return Path(out) / RESULT_JSON


def format_rows(rows: list[SessionRow]) -> str:
    """One block per session: its verdict line, then where it ran and what was lost."""
    lines = []
    for r in sorted(rows, key=lambda r: (r.host_class or "", r.session)):
        lines.append(f"{r.session} {r.contract}: {r.verdict_line}")
        lines.append(f"  on {r.box or 'no box'} ({r.host_class or 'class unknown'}), {r.attempts} attempt(s)")
        lines += [f"  lost: {x}" for x in r.lost or []]
        if r.box_said:
            lines.append(f"  note: {r.box_said}")
    return "\n".join(lines)
