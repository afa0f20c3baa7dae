"""Reading vLLM's output: which process wrote a line (its rank tag), where a traceback ends, the line
that names why a start failed (`root_cause`). Pure functions of text: the launcher, the evidence of a
start and the tests of recorded logs share them."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..evidence.record import Failure

# "(Worker_TP1_EP1 pid=123)", "(EngineCore pid=7)", "(APIServer pid=5)", "(Worker pid=9)", "(VllmWorker-0 pid=9)"
RANK_TAG = re.compile(r"^\((?P<tag>[A-Za-z][\w\-]*) pid=(?P<pid>\d+)\)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")

FATAL = re.compile(
    r"Segfault encountered|Traceback \(most recent call last\)|died unexpectedly|"
    r"RuntimeError|EngineCore failed to start|Fatal Python error"
)
# A process the interpreter aborted (written by CPython to the process's stderr, untagged).
ABORTED = "Fatal Python error: "
# A rank's exception that only reports a peer gone (gloo's "Connection closed by peer ... typically caused by a
# remote worker crashing"): the effect of another rank's death, whatever order the logs interleave in.
PEER_LOST = re.compile(r"Connection (?:closed|reset) by peer|remote worker crash|Broken pipe", re.IGNORECASE)
TRACEBACK = "Traceback (most recent call last):"
# vLLM's log-record header after the rank tag ("ERROR 12-01 10:00:00 [multiproc_executor.py:953] "): vLLM
# repeats tag and header on every line of a multi-line record, a logged traceback's lines included.
LOG_HEADER = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] ")
# A traceback's last line: the exception's class, dotted or not, then ": message" or nothing
# ("NotImplementedError: ...", "torch.OutOfMemoryError: ...", "AssertionError"). Any class, not a list of names.
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::(?:\s.*)?)?$")
# The processes that are ranks: "(Worker pid=)", "(Worker_TP1_EP1 pid=)", and early on "(VllmWorker-0 pid=)".
RANK_PROCESS = re.compile(r"^(?:Vllm)?Worker(?:$|[_\-])")


def split_line(line: str) -> tuple[str | None, str]:
    """A line of the engine's output as (the process tag vLLM put in front of it, or None; what it says, with
    the log-record header and trailing whitespace removed: vLLM ends a multi-line record's lines in "\\r")."""
    m = RANK_TAG.match(line)
    body = line[m.end() :].removeprefix(" ") if m else line
    return (m.group("tag") if m else None), LOG_HEADER.sub("", body, count=1).rstrip()


def is_exception_line(body: str) -> bool:
    """`body` (split_line's) reads as the last line of a traceback: an exception's name, unindented."""
    return bool(body) and not body.startswith(TRACEBACK) and EXCEPTION_LINE.match(body) is not None


# What Python writes before the traceback of an exception it ignored (sys.unraisablehook: one raised in a
# __del__ during garbage collection, as vLLM's CPUDNNLGEMMHandler.__del__ does while a model compiles).
UNRAISABLE = "Exception ignored in"


class TracebackEnds:
    """Fed the engine's output line by line, says what each line is to a Python traceback, per process tag:
    END for the exception line that ends one (the first unindented exception line after `Traceback (most
    recent call last):`; its frames are indented), IGNORED for the `Traceback` line of an exception that
    Python reported and ignored (after `Exception ignored in: ...`: nothing failed), else None."""

    END, IGNORED = "end", "ignored"

    def __init__(self) -> None:
        self._open: dict[str | None, bool] = {}  # tag -> whether its open traceback counts
        # tag -> `Exception ignored in` notices whose traceback has not begun yet. Counted, not read off the
        # line before: two ranks' unraisable tracebacks go to stderr untagged and interleave, a notice in the
        # middle of another's line or a line or two before its own `Traceback` (seen while the model compiles).
        self._ignored: dict[str | None, int] = {}

    def feed(self, line: str) -> str | None:
        tag, body = split_line(line)
        if notices := body.count(UNRAISABLE):  # two ranks' notices can land on one line, each its own traceback
            self._ignored[tag] = self._ignored.get(tag, 0) + notices
        if body.startswith(TRACEBACK):
            pending = self._ignored.get(tag, 0)
            self._open[tag] = not pending
            if pending:
                self._ignored[tag] = pending - 1
                return self.IGNORED
            return None
        if tag in self._open and is_exception_line(body):
            return self.END if self._open.pop(tag) else None
        return None


# What the launcher writes before a line of its own about a process the kernel's OOM killer killed (oom.PREFIX).
OUT_OF_MEMORY = "out of memory: "


def root_cause(errors: list[str]) -> tuple[str | None, str] | None:
    """Which of a failed start's error lines (EngineServer.first_errors, in the order they were written) says
    why it failed, as (process tag or None, what the line says):

    0. a process the kernel's OOM killer killed (the launcher's line, from the kernel log: the process itself
       wrote nothing, and the executor's "died unexpectedly" names no cause), then a process the interpreter
       aborted (`Fatal Python error: ...`);
    1. the first exception a rank raised: the last line of its first traceback
       (`NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.`);
    2. else a line naming a process that died (`Worker proc VllmWorker-1 died unexpectedly (exit code: 0)`):
       the executor writes it after a rank raised or was killed, which makes it the effect when 1 exists; a
       rank's exception that only says a peer is gone (PEER_LOST) is the effect of that death and comes after;
    3. else the first exception of another process (engine core, API server), one that points elsewhere for
       its cause last (vLLM's `... See root cause above.`);
    4. else the first other error line. A bare `Traceback (most recent call last):` names nothing: never."""
    lines = [split_line(e) for e in errors]
    killed = [(tag, body) for tag, body in lines if body.startswith(OUT_OF_MEMORY)]
    aborted = [(tag, body) for tag, body in lines if body.startswith(ABORTED)]
    exceptions = [(tag, body) for tag, body in lines if is_exception_line(body)]
    ranks = [(tag, body) for tag, body in exceptions if tag and RANK_PROCESS.match(tag)]
    raised, peer_lost = [r for r in ranks if not PEER_LOST.search(r[1])], [r for r in ranks if PEER_LOST.search(r[1])]
    died = [(tag, body) for tag, body in lines if "died unexpectedly" in body]
    others = sorted(exceptions, key=lambda e: "root cause" in e[1].lower())  # stable: in order otherwise
    rest = [(tag, body.strip()) for tag, body in lines if body.strip() and not body.strip().startswith(TRACEBACK)]
    order = (killed, aborted, raised, died, peer_lost, others, rest)
    return next((found[0] for found in order if found), None)


def failure_headline(failure: Failure) -> str:
    """A failure's first line, and the cause the engine's output names (root_cause over the error lines the
    launcher saw: the exception a rank raised, else the line naming a dead process, ...) with the process
    that wrote it: `...; cause on Worker_TP1_EP1: NotImplementedError: FP8 KV cache on CPU requires ...`."""
    first = failure.first_line
    found = root_cause(failure.first_errors)
    if found is None:
        return first
    tag, cause = found
    return f"{first}; cause{f' on {tag}' if tag else ''}: {cause}"
