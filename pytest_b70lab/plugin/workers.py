"""Several processes, one session: xdist workers share the controller's run folder and one marker of a
failed start, and SIGTERM unwinds like Ctrl-C so that engines are torn down and their evidence written."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .state import WORKER_BLOCK_MARK, WORKER_RUN_DIR, LabState


class XdistHooks:
    """Every xdist worker uses the controller's run folder, so they share one engine launch, and one marker
    file of this session there, so that one failed start is one failure (block_session)."""

    def __init__(self, state: LabState):
        import secrets

        self.state = state
        self.block_mark = state.run_dir / f".blocked-{secrets.token_hex(6)}"  # this session's alone
        self.relay: ProgressRelay | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[WORKER_RUN_DIR] = str(self.state.run_dir)
        node.workerinput[WORKER_BLOCK_MARK] = str(self.block_mark)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if not hasattr(config, "workerinput"):
            self.block_mark.unlink(missing_ok=True)
            for mark in self._finished_marks():
                mark.unlink(missing_ok=True)

    def _finished_marks(self) -> list[Path]:
        return list(self.state.run_dir.glob(self.block_mark.name.replace(".blocked-", ".finished-", 1) + "-*"))

    interrupted_by_signal = False

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        # Ctrl-C, or SIGTERM passed on below: a plain KeyboardInterrupt. pytest's and xdist's `Interrupted`
        # (a stopped session) are subclasses, and their workers are idle, waiting to be shut down.
        if type(excinfo.value) is KeyboardInterrupt:
            self.interrupted_by_signal = True

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Interrupted by a signal, the workers are each tearing an engine down and writing its evidence:
        wait for them (bounded) before xdist's own teardown, which kills a worker that takes over 10 s. A
        worker is done when it has exited or said so (WorkerFinished); it then stays alive, waiting for the
        controller, so waiting for it to exit alone always took the whole bound."""
        if hasattr(session.config, "workerinput"):
            return
        if self.interrupted_by_signal:
            self._wait_for_workers()
        if self.relay is not None:
            self.relay.stop()  # the workers' last lines before the verdict

    def _wait_for_workers(self) -> None:
        import psutil

        deadline = time.monotonic() + 90
        workers = psutil.Process().children()
        while time.monotonic() < deadline:
            said = {mark.name.rsplit("-", 1)[-1] for mark in self._finished_marks()}
            if all(not w.is_running() or w.status() == psutil.STATUS_ZOMBIE or str(w.pid) in said for w in workers):
                return
            time.sleep(0.2)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_setupnodes(self, config, specs) -> None:
        """SIGTERM to the controller alone (a cancelled CI job) would end it and leave its workers, and their
        engines, to finish on their own: pass it on to the workers, which unwind like Ctrl-C while a start
        runs (`sigterm_as_interrupt`), then stop the controller as Ctrl-C does."""

        def forward() -> None:
            import signal

            import psutil

            for child in psutil.Process().children():
                try:
                    child.send_signal(signal.SIGTERM)
                except psutil.NoSuchProcess:
                    continue

        sigterm_raises_interrupt(first=forward)
        self.relay = ProgressRelay(self.state)
        self.relay.start()


class ProgressRelay:
    """On the xdist controller: the workers' progress lines on its terminal while they work. xdist brings a
    worker's report back only when a test's phase ends, and discards what the worker's terminal writes, while
    an engine start holds a worker's first test for minutes; xdist has no hook for a message in between. So
    each worker appends its lines to RUN/progress.log (LabState.say) and a thread here tails that file."""

    POLL_S = 0.5

    def __init__(self, state: LabState):
        from ..evidence.run_folder import PROGRESS_LOG

        self.state = state
        self.path = state.run_dir / PROGRESS_LOG
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._offset = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        # A reused run folder keeps an earlier session's lines: this session's begin at the file's end.
        self._offset = self.path.stat().st_size if self.path.is_file() else 0
        self._thread = threading.Thread(target=self._run, name="b70lab-progress-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self.POLL_S):
            self.drain()

    def drain(self) -> None:
        """Write the whole lines added since the last call (a line still being written waits)."""
        with self._lock:
            try:
                with open(self.path, "rb") as log:
                    log.seek(self._offset)
                    data = log.read()
            except OSError:
                return
            complete = data[: data.rfind(b"\n") + 1]
            self._offset += len(complete)
            reporter = self.state.config.pluginmanager.get_plugin("terminalreporter")
            for line in complete.decode("utf-8", "replace").splitlines():
                if reporter is not None:
                    reporter.write_line(f"b70lab: {line}")

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.drain()


class WorkerFinished:
    """On an xdist worker: once its session is over (its engines stopped, their evidence written), a marker
    in the run folder tells the controller, which waits for it after an interrupt (XdistHooks)."""

    def __init__(self, block_mark: Path):
        self.mark = block_mark.with_name(block_mark.name.replace(".blocked-", ".finished-", 1) + f"-{os.getpid()}")

    @pytest.hookimpl(trylast=True)  # after pytest's own, which tears the session's fixtures (and engines) down
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.mark.parent.is_dir():
            self.mark.touch()


def claim_block(state: LabState, message: str) -> tuple[bool, str]:
    """(whether this process reports the block, the session's first failure). Without xdist, this process
    alone; on a worker, the first to create the session's marker (an atomic link of a file holding the
    message: the others read it whole)."""
    if state.blocked is not None or state.block_mark is None:
        return state.blocked is None, state.blocked or message
    import os

    mark = state.block_mark
    mark.parent.mkdir(parents=True, exist_ok=True)
    draft = mark.with_name(f"{mark.name}.{os.getpid()}")
    draft.write_text(message, encoding="utf-8")
    try:
        os.link(draft, mark)
        return True, message
    except FileExistsError:
        return False, mark.read_text(encoding="utf-8") or message
    except OSError:  # a folder without hard links: rather two failures than none
        return True, message
    finally:
        draft.unlink(missing_ok=True)


def blocked_elsewhere(state: LabState) -> str | None:
    """On an xdist worker: the first failure another worker reported, if one did."""
    if state.block_mark is None:
        return None
    try:
        return state.block_mark.read_text(encoding="utf-8") or None
    except FileNotFoundError:
        return None


def blocked_reason(message: str) -> str:
    return f"not run after this session's first failure: {message}"


def sigterm_raises_interrupt(first: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """Make SIGTERM (a CI job cancelled, `kill`) unwind like Ctrl-C, after running `first`: engine teardown
    then stops every engine process and writes the start's evidence, instead of Python dying at once and
    leaving the ranks to their parent-death signal. Only where it is pytest's to change (the main thread, the
    default handler still in place); returns what restores the default, or None when nothing was changed."""
    import signal
    import threading

    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        return None

    def interrupt(signum, frame):
        if first is not None:
            first()
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    return restore


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While a session runs engine starts, SIGTERM unwinds like Ctrl-C (sigterm_raises_interrupt)."""
    restore = sigterm_raises_interrupt()
    try:
        yield
    finally:
        if restore is not None:
            restore()
