"""A start being served: its server, the evidence it fills and the client that asks it. The sequential
schedule (starts.run_start) launches, serves and closes one at a time; the interleaved one (interleave.py)
keeps two alive. What a start's evidence records of its launch (environment, log findings) is decided here."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract import project
from ..contract import schema as contract_mod
from ..contract.schema import Contract
from ..evidence import host
from ..evidence import record as evidence
from ..quality.samples import QualitySample
from . import disk
from .client import EngineRequestError, audit, metrics_text, quality_answer, served_model, stream_completion
from .command import ServeConfig, vllm_serve_command
from .logs import TracebackEnds
from .server import EngineServer, EngineStartError

Progress = Callable[[str], None]
# Log lines a gate must see even though nothing else reports them (vLLM says "Cannot use X backend" once,
# at INFO, and runs another backend).
LOG_FINDINGS = {
    "backend_fallback": re.compile(r"Cannot use \S+ backend|[Ff]alling back to"),
    "kv_scale_notice": re.compile(r"scaling factor|calculate_kv_scales"),
    "native_crash": re.compile(r"Segfault encountered|Fatal Python error"),
    # vLLM's records at ERROR or CRITICAL level (the header after the process tag).
    "error_record": re.compile(r"^(?:\([\w\-]+ pid=\d+\) )?(?:ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d "),
}
# Also found, not by a pattern: "exception", the last line of every traceback a process printed for an
# exception it raised (TracebackEnds; the tracebacks of exceptions Python ignored are left out). What
# judges each kind, or why it is only informational: evidence_checks.LOG_FINDING_KINDS.
EXCEPTION_FINDING = "exception"


def log_findings(lines: list[str], limit: int = 50) -> dict[str, list[str]]:
    """The lines of a start's server log that the gates judge, by kind (each kind present, empty if none)."""
    found = {kind: [line for line in lines if pattern.search(line)][:limit] for kind, pattern in LOG_FINDINGS.items()}
    ends = TracebackEnds()
    found[EXCEPTION_FINDING] = [line for line in lines if ends.feed(line) == ends.END][:limit]
    return found


# ZE_, ONEAPI_ and CCL_: the XPU profile's device selection and oneCCL settings (xpu_environment).
ENV_KEYS_RECORDED = (
    "VLLM_",
    "B70LAB_",
    "OMP_",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "LD_PRELOAD",
    "ZE_",
    "ONEAPI_",
    "CCL_",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
)
# Evidence and the dry run are shared and kept: a variable named like a secret shows that it was set, never
# its value (VLLM_API_KEY of the benchmark mode, a B70LAB_*_TOKEN a lab passes through).
SECRET_NAME = re.compile(r"_TOKEN$|KEY|SECRET|PASSWORD", re.IGNORECASE)
REDACTED = "<redacted>"


def recorded_environment(env: dict[str, str]) -> dict[str, str]:
    """The variables of the engine's environment that shape a start, secrets' values redacted."""
    return {
        k: REDACTED if SECRET_NAME.search(k) else v for k, v in sorted(env.items()) if k.startswith(ENV_KEYS_RECORDED)
    }


@dataclass(frozen=True)
class ResolvedModels:
    target: evidence.ModelRef
    draft: evidence.ModelRef | None
    target_model: str | Path
    draft_model: str | Path | None
    # The checkpoint tables the load and scale audits compare with ("target", "draft"; None where a
    # checkpoint could not be read, with the reason under "problems").
    tables: dict[str, Any]


class LiveStart:
    """A start being served: its server, the evidence it is filling, its client. The sequential schedule
    launches, serves and closes one at a time; the interleaved one (interleave.py) keeps two alive."""

    def __init__(self, contract: Contract, server: EngineServer, record: evidence.Evidence, say: Progress):
        self.contract, self.server, self.record, self.say = contract, server, record, say
        self.index = record.start_index
        self.client: Any = None
        self.model = ""

    @classmethod
    def launch(
        cls,
        contract: Contract,
        models: ResolvedModels,
        config: ServeConfig,
        env: dict[str, str],
        start_dir: Path,
        index: int,
        progress: Progress | None = None,
        launches_log: Path | None = None,
        probe: dict | None = None,
    ) -> LiveStart:
        """The start's server and its evidence record (failed until it says otherwise); nothing runs yet."""
        say = progress or (lambda _msg: None)
        nonce = secrets.token_hex(16)  # this start's alone: its ranks echo it in their audits
        server = EngineServer(
            lambda sock: vllm_serve_command(config.model_ref, sock, config.args()),
            {**env, evidence.START_NONCE_ENV: nonce},
            start_dir,
            on_progress=lambda ph, t: say(f"{contract.name} start-{index}: {ph} ({t:.0f} s)"),
        )
        record = _new_record(contract, models, index, nonce, server.command, env, probe)
        if launches_log is not None:
            with open(launches_log, "a", encoding="utf-8") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid={os.getpid()} {contract.name} start-{index}\n")
        return cls(contract, server, record, say)

    def prompts(self, prompt_ids: list[str] | None) -> list:
        found = contract_mod.load_prompts(self.contract)
        return contract_mod.select_prompts(found, prompt_ids, f"contract {self.contract.name}: the prompts asked for")

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """Whatever happens inside, the start is torn down and its evidence written; a failure is recorded in
        it (an engine or request failure ends the block quietly, Ctrl-C or a bug is raised on)."""
        try:
            yield
        except (EngineStartError, EngineRequestError, OSError, ValueError) as e:
            self.fail(e)
        except BaseException as e:
            self.fail(e)
            self.finish()
            raise
        self.finish()

    def fail(self, e: BaseException) -> None:
        server = self.server
        if isinstance(e, EngineStartError):  # a start-up failure already carries the logs' error lines
            message = str(e)
        elif isinstance(e, EngineRequestError | OSError | ValueError):
            message = server.failure_report(str(e))
        else:
            message = f"interrupted: {type(e).__name__}: {e}"
        if self.record.failure is None:
            self.record.failure = evidence.Failure(
                message=message, phase=server.phase, tails=server.tails(), first_errors=server.first_errors()
            )
        self.record.status = "failed"

    def open(self) -> None:
        """Start the server and wait for it; then the ranks' audits, exposure and the opening /metrics."""
        self.server.start()
        self.record.ready_s = self.server.wait_ready(self.contract.deadlines.start_s)
        self.client = self.server.client(timeout=self.contract.deadlines.request_s)
        self.server.phase = "auditing the ranks"
        self.record.audits = audit(self.client)
        self.record.exposure = self.server.exposure()  # every rank is up: all their sockets are open now
        self.record.metrics_before = metrics_text(self.client)
        self.model = served_model(self.client)
        self.server.phase = "serving the gate prompts"

    def serve(self, p: Any, label: str = "") -> evidence.Request:
        """One gate prompt, streamed; the caller decides where the evidence keeps it. The harness's own garbage
        collector is off while the tokens are timed: a full collection here takes ~0.1 s once torch is imported
        (it is: the mini build), long enough to hold back a chunk and bunch the next ones."""
        self.server.check_writes()
        collecting = gc.isenabled()
        gc.disable()
        try:
            r = stream_completion(
                self.client,
                self.model,
                p.prompt,
                self.contract.decode.tokens_per_request,
                prompt_id=p.id,
                timeout_s=self.contract.deadlines.request_s,
            )
        finally:
            if collecting:
                gc.enable()
        self.say(
            f"{self.contract.name} start-{self.index}: {p.id}{' ' + label if label else ''} {len(r.token_ids)} tokens"
            + (f" at {r.decode_rate:.1f} tok/s" if r.decode_rate else "")
        )
        return r

    def close(self, quality: list[QualitySample] | None) -> None:
        """The closing /metrics, then the quality samples (after it: no gate evidence sees them)."""
        record = self.record
        record.metrics_after = metrics_text(self.client)
        if quality:
            self.server.phase = "serving the quality samples"
            _ask_quality(self.client, self.model, quality, record, self.contract, self.index, self.say)
        record.throughput = evidence.derived_throughput(record.requests, record.metrics_before, record.metrics_after)
        record.status = "ok"

    def finish(self) -> None:
        if self.client is not None:
            self.client.close()
        _finish(self.server, self.record, self.server.log_dir)


def _new_record(
    contract: Contract,
    models: ResolvedModels,
    index: int,
    nonce: str,
    command: list[str],
    env: dict[str, str],
    probe: dict | None,
) -> evidence.Evidence:
    """The evidence of a start about to launch: failed until the start says otherwise."""
    created_at = dt.datetime.now(dt.UTC).isoformat()
    return evidence.Evidence(
        role=contract.kind,
        start_index=index,
        created_at=created_at,
        identity=evidence.StartIdentity(nonce=nonce, launched_at=created_at),
        contract=evidence.ContractRef(
            name=contract.name, kind=contract.kind, digest=contract.digest, canonical=contract.canonical()
        ),
        target=models.target,
        draft=models.draft,
        engine=evidence.EngineInfo(
            vllm_version=host.library_version("vllm"),
            torch_version=host.library_version("torch"),
            command=command,
            environment=recorded_environment(env),
        ),
        status="failed",
        probe=probe,
        host={**host.cpu_identity(environ=env), "box": host.box_identity(env)},
        lab_commit=project.commit(),
    )


def _ask_quality(
    client,
    model: str,
    samples: list[QualitySample],
    record: evidence.Evidence,
    contract: Contract,
    index: int,
    say: Progress,
) -> None:
    assert contract.quality is not None
    t0, failed = time.monotonic(), 0
    for sample in samples:
        for variant in sample.variants:
            answer = quality_answer(client, model, sample, variant, timeout_s=contract.quality.request_s)
            failed += answer.error is not None
            record.quality.append(answer)
    say(
        f"{contract.name} start-{index}: {len(record.quality)} quality answers in {time.monotonic() - t0:.0f} s"
        + (f", {failed} requests failed" if failed else "")
    )


def _finish(server: EngineServer, record: evidence.Evidence, start_dir: Path) -> None:
    report = server.stop()
    record.teardown = report.as_dict()
    record.logs = {
        "server": "server.log",
        "command": "command.txt",
        **{f"rank:{p.stem}": f"ranks/{p.name}" for p in sorted((start_dir / "ranks").glob("*.log"))},
    }
    log = start_dir / "server.log"
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.exists() else []
    record.log_findings = log_findings(lines[: report.log_line])  # before teardown: after it, the shutdown speaks
    if record.status == "ok" and not report.clean:
        record.status = "failed"
        record.failure = evidence.Failure(
            message="engine processes outlived teardown: "
            + ", ".join(f"pid {p.pid} {p.name}" for p in report.survivors())
        )
    _write_evidence(record, start_dir, disk_full=server.write_error is not None)


def _write_evidence(record: evidence.Evidence, start_dir: Path, disk_full: bool) -> None:
    """The evidence, written whole or not at all (evidence.write is atomic). On a full disk the run's reserve
    (disk.hold_reserve, in the kind's folder above the start's) is given back first, so that the failed start's
    evidence says why."""
    if disk_full:
        disk.release_reserve(start_dir.parent)
    try:
        evidence.write(record, start_dir)
        return
    except OSError as e:
        if not disk.is_full(e):
            raise
        first = e
    if disk.release_reserve(start_dir.parent):
        with contextlib.suppress(OSError):
            evidence.write(record, start_dir)
            return
    why = record.failure.first_line if record.failure else f"start-{record.start_index} was {record.status}"
    raise disk.DiskFullError(
        f"start-{record.start_index}'s evidence could not be written ({why}): "
        f"{disk.full_message(start_dir / evidence.FILENAME, first, start_dir.parent)}"
    )
