"""A failed start names its root cause: the exception a rank raised, read from the engine's output.

fixtures/engine-logs/rank-refuses-fp8-kv-cache.log is an excerpt of a real start's server.log (vLLM 0.32 CPU,
TP2 + EP2, fault `raise-kv-cache:1` of tests/faults: rank 1 raises NotImplementedError where vLLM's CPU
attention refuses an FP8 cache on a CPU without AVX-512), long tracebacks shortened, paths made relative. It
holds what hid the cause before: four `Exception ignored in: <function CPUDNNLGEMMHandler.__del__>` tracebacks
printed while the model compiles (nothing failed), the engine core's `RuntimeError: Worker failed with error
..., please check the stack trace above for the root cause`, the executor's `Worker proc VllmWorker-0 died
unexpectedly (exit code: 0)`, and the API server's `RuntimeError: Engine core initialization failed. See root
cause above.`"""

from __future__ import annotations

import io
import shutil
import traceback
from pathlib import Path

import pytest

from pytest_b70lab.engine.logs import (
    UNRAISABLE,
    TracebackEnds,
    failure_headline,
    is_exception_line,
    root_cause,
    split_line,
)
from pytest_b70lab.engine.server import EngineServer
from pytest_b70lab.evidence import record as evidence

REPO = Path(__file__).resolve().parents[2]
LOG = REPO / "fixtures" / "engine-logs" / "rank-refuses-fp8-kv-cache.log"
INJECTED = (
    "b70lab fault injected: rank 1 refuses its FP8 KV cache, as vLLM's CPU attention does on a CPU "
    "without AVX-512 or AMX"
)
REAL = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."  # vLLM 0.32, cpu_attn._get_attn_isa
DIED = (
    "(EngineCore pid=7803) ERROR 12-01 09:15:13 [multiproc_executor.py:315] Worker proc VllmWorker-0 died "
    "unexpectedly (exit code: 0), shutting down executor."
)


class _Output:
    def __init__(self, data: bytes):
        self.stdout = io.BytesIO(data)


def _first_errors(text: str, tmp_path: Path) -> list[str]:
    """The error lines the launcher keeps of `text`, read as it reads a running server's output."""
    server = EngineServer(lambda sock: ["true"], {}, tmp_path)
    try:
        (tmp_path / "ranks").mkdir(parents=True, exist_ok=True)
        server.proc = _Output(text.encode())  # type: ignore[assignment]
        server._read_output()
        return server.first_errors()
    finally:
        shutil.rmtree(server.socket_dir, ignore_errors=True)


def test_the_rank_that_refused_its_kv_cache_is_the_cause(tmp_path: Path) -> None:
    errors = _first_errors(LOG.read_text(encoding="utf-8"), tmp_path)
    assert not any("RecursionError" in e for e in errors), errors  # the ignored exceptions are no error lines
    assert root_cause(errors) == ("Worker_TP1_EP1", f"NotImplementedError: {INJECTED}")


def test_the_headline_names_the_real_refusal_and_its_rank(tmp_path: Path) -> None:
    """The same start where vLLM itself refuses: the refusal leads, not "died unexpectedly" nor "Traceback"."""
    errors = _first_errors(LOG.read_text(encoding="utf-8").replace(INJECTED, REAL), tmp_path)
    failure = evidence.Failure(
        message="the server exited with code 1 during start-up (phase: allocating KV cache, 130 s)\nlogs: ...",
        phase="allocating KV cache",
        first_errors=errors,
    )
    assert failure_headline(failure) == (
        "the server exited with code 1 during start-up (phase: allocating KV cache, "
        f"130 s); cause on Worker_TP1_EP1: NotImplementedError: {REAL}"
    )


def test_evidence_written_before_exception_lines_were_kept_still_names_the_dead_process() -> None:
    """What a start recorded before: the ignored exceptions' Traceback lines first, then the dead process."""
    old = ["Traceback (most recent call last):"] * 4 + [
        "(EngineCore pid=7803) ERROR 12-01 09:15:03 [core.py:1510] RuntimeError: Worker failed with error 'x', "
        "please check the stack trace above for the root cause",
        DIED,
    ]
    assert root_cause(old) == ("EngineCore", DIED.split("] ", 1)[1])
    assert root_cause(["Traceback (most recent call last):"]) is None  # names nothing: never the cause
    failure = evidence.Failure(
        message="the server exited with code 1", first_errors=["Traceback (most recent call last):"]
    )
    assert failure_headline(failure) == "the server exited with code 1"


@pytest.mark.parametrize(
    "body",
    [
        f"NotImplementedError: {REAL}",
        "torch.OutOfMemoryError: out of memory",
        "pytest_b70lab.in_engine.faults.InjectedFault: b70lab fault injected: rank 1 cannot load its weights",
        "SomeException:",
        "AssertionError",
        "KeyboardInterrupt",
    ],
)
def test_any_exception_class_is_an_exception_line(body: str) -> None:
    assert is_exception_line(body)


@pytest.mark.parametrize(
    "body",
    [
        "Traceback (most recent call last):",
        '  File "vllm/v1/worker/gpu_worker.py", line 894, in initialize_from_config',
        "Worker proc VllmWorker-1 died unexpectedly (exit code: 0), shutting down executor.",
        "EngineCore failed to start.",
        "Exception ignored in: <function CPUDNNLGEMMHandler.__del__ at 0x7fcae0fd8360>",
        "",
    ],
)
def test_other_lines_are_not(body: str) -> None:
    assert not is_exception_line(body)


def test_a_chained_exception_names_the_first_one_raised() -> None:
    """Python prints the cause's traceback first: that is the root, the rest follows from it."""
    try:
        try:
            {}["kv_cache"]
        except KeyError as e:
            raise RuntimeError("could not build the attention") from e
    except RuntimeError as e:
        text = "".join(traceback.format_exception(e))
    lines = [
        f"(Worker_TP0 pid=9) ERROR 12-01 09:15:02 [multiproc_executor.py:953] {line}" for line in text.splitlines()
    ]
    ends = TracebackEnds()
    assert [split_line(line)[1] for line in lines if ends.feed(line) == ends.END] == [
        "KeyError: 'kv_cache'",
        "RuntimeError: could not build the attention",
    ]
    assert root_cause(lines) == ("Worker_TP0", "KeyError: 'kv_cache'")


def test_two_ignored_notices_on_one_line_ignore_both_tracebacks() -> None:
    """Two ranks' unraisable notices written onto one line (seen in a TP4 start's log while it compiled:
    `Exception ignored in: Exception ignored in: <function CPUDNNLGEMMHandler.__del__ ...>`), then their two
    tracebacks: neither RecursionError is an exception a process raised."""
    lines = [
        "Exception ignored in: Exception ignored in: <function CPUDNNLGEMMHandler.__del__ at 0x7fa1bcc00040>",
        "Traceback (most recent call last):",
        '  File "vllm/_custom_ops.py", line 1, in __del__',
        "Traceback (most recent call last):",
        '  File "vllm/_custom_ops.py", line 1, in __del__',
        "RecursionError: maximum recursion depth exceeded in comparison",
        "RecursionError: maximum recursion depth exceeded in comparison",
    ]
    ends = TracebackEnds()
    assert [ends.feed(line) for line in lines] == [None, ends.IGNORED, None, ends.IGNORED, None, None, None]


@pytest.mark.parametrize(
    ("errors", "cause"),
    [
        # a rank's exception before the engine core's that points back to it
        (
            [
                "(EngineCore pid=7) ERROR 12-01 09:15:03 [core.py:1510] Exception: WorkerProc initialization failed due to "
                "an exception in a background process. See stack trace for root cause.",
                "(Worker_TP1_EP1 pid=9) ERROR 12-01 09:15:02 [multiproc_executor.py:953] OSError: no such file",
            ],
            ("Worker_TP1_EP1", "OSError: no such file"),
        ),
        # no rank raised: the process that died
        (
            [
                "(EngineCore pid=7) ERROR 12-01 09:15:03 [core.py:1510] EngineCore failed to start.",
                "(EngineCore pid=7) ERROR 12-01 09:15:03 [core.py:1510] Traceback (most recent call last):",
                DIED,
            ],
            ("EngineCore", DIED.split("] ", 1)[1]),
        ),
        # nor died: the other process's own exception before the one that points elsewhere
        (
            [
                "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
                "(EngineCore pid=7) ERROR 12-01 09:15:03 [core.py:1510] ValueError: No common block size for 32 "
                "(FLASH_ATTN: [MultipleOf(64)]).",
            ],  # notes/2026-11-30-xpu-flash-attn-needs-page-64.md
            ("EngineCore", "ValueError: No common block size for 32 (FLASH_ATTN: [MultipleOf(64)])."),
        ),
        # only lines that are no exception
        (
            ["(EngineCore pid=7) ERROR 12-01 09:15:03 [core.py:1510] EngineCore failed to start."],
            ("EngineCore", "EngineCore failed to start."),
        ),
        (["Segfault encountered"], (None, "Segfault encountered")),
    ],
)
def test_the_choice_of_cause(errors: list[str], cause: tuple[str | None, str]) -> None:
    assert root_cause(errors) == cause


def test_the_log_findings_keep_raised_exceptions_and_error_records_not_ignored_tracebacks() -> None:
    """What a start's evidence keeps of this log for evidence-logs: the exception lines of the tracebacks a
    process raised (never those of the four tracebacks Python ignored while compiling), and vLLM's ERROR
    records."""
    from pytest_b70lab.engine import live

    lines = LOG.read_text().splitlines()
    found = live.log_findings(lines, limit=len(lines))
    assert set(found) == {*live.LOG_FINDINGS, live.EXCEPTION_FINDING}
    ignored = [i + 1 for i, line in enumerate(lines) if line.startswith(UNRAISABLE)]
    assert len(ignored) == 4
    assert not [line for line in found["exception"] if "RecursionError" in line], found["exception"]
    assert any(REAL in line or INJECTED in line for line in found["exception"]), found["exception"]
    assert DIED in found["error_record"]
    assert all(" ERROR " in line for line in found["error_record"])


# A rank aborted by the interpreter while it compiled (the __del__ recursion's fatal form, before the
# cpu_dnnl_handler_release fix), as the fault matrix's rank-raises-allocating-kv-cache row met it on
# 2026-12-04: the other rank's gloo error came first in the log, and was the cause line then.
ABORTED_RANK = [
    "(EngineCore pid=11847) ERROR 12-04 02:55:42 [multiproc_executor.py:315] Worker proc VllmWorker-1 died "
    "unexpectedly (exit code: -6), shutting down executor.",
    "(Worker_TP0_EP0 pid=11924) ERROR 12-04 02:55:42 [multiproc_executor.py:1063] Traceback (most recent call last):",
    "(Worker_TP0_EP0 pid=11924) ERROR 12-04 02:55:42 [multiproc_executor.py:1063] RuntimeError: [../gloo/transport/"
    "tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:44177. This is typically caused by a remote worker "
    "crashing. Check the logs of the remote worker before reporting an error. GLHF!",
    "(EngineCore pid=11847) ERROR 12-04 02:55:42 [core.py:1510] EngineCore failed to start.",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
]
FATAL_LINE = "Fatal Python error: _Py_CheckRecursiveCall: Cannot recover from stack overflow."


def test_an_aborted_process_is_the_cause_and_a_lost_peer_is_an_effect() -> None:
    assert root_cause([*ABORTED_RANK, FATAL_LINE]) == (None, FATAL_LINE)
    # Without CPython's line, the dead process is named, not the rank that only lost its peer.
    assert root_cause(ABORTED_RANK) == (
        "EngineCore",
        "Worker proc VllmWorker-1 died unexpectedly (exit code: -6), shutting down executor.",
    )
    # A rank's own exception still comes first.
    raised = "(Worker_TP1_EP1 pid=11925) ERROR 12-04 02:55:41 [x.py:1] NotImplementedError: refused"
    assert root_cause([*ABORTED_RANK, raised]) == ("Worker_TP1_EP1", "NotImplementedError: refused")
