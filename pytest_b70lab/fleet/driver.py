"""The fleet's driver: connect to a Ray cluster, run one task per shard on a box, record every attempt in the
ledger, and bring each finished shard's folder home, checked file by file.

Ray must never re-run a task by itself: a silent re-run could move a measurement to another box. So every task
has max_retries=0 and retry_exceptions=False (and its results, a streaming generator's items, are not rebuilt
from lineage: a task that may not be retried cannot be re-executed to rebuild them). A lost box is an event in the
ledger and the shard runs again whole, as a new attempt with a folder of its own, on a box of the same host class:
partial folders are never merged across boxes."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import LabError
from ..evidence import host
from . import box
from .ledger import Ledger
from .shards import SHARDS_DIR, Shard

Progress = Callable[[str], None]
MAX_ATTEMPTS = 3  # per shard: the first and two re-runs after a lost box or a failed attempt
POLL_S = 2.0


class FleetError(LabError, RuntimeError):
    """The fleet cannot be reached, or a shard could not be measured within its attempts."""


def shard_task(sweep: str, shard: str, attempt: int, work: Any) -> Iterator[dict[str, Any]]:
    """Runs on the box, in a Ray worker: first says where it is (the driver's ledger names the box of an attempt
    that is lost later), then runs the shard and yields its packed folder."""
    import ray

    from ..mini.build import default_cache_root

    context = ray.get_runtime_context()
    labels = context.get_node_labels()
    facts = box.BoxFacts(
        label=labels.get(box.BOX_LABEL) or os.environ.get(host.BOX_ENV) or context.get_node_id()[:12],
        digest=host.box_identity()["digest"],
        host_class=labels.get(box.CLASS_LABEL),
        node=context.get_node_id(),
    )
    yield {"box": asdict(facts)}
    if facts.host_class and facts.host_class != box.class_key():
        raise box.BoxError(
            f"the node is labelled host class {facts.host_class}, this machine's class is {box.class_key()}: "
            "relabel the node (`b70lab fleet labels` prints its labels)"
        )
    os.environ[host.BOX_ENV] = facts.label  # every start's evidence names the box by the node's label
    process = box.normalise(int(os.environ.get("RAY_RAYLET_PID") or 0) or None)
    cache_root = default_cache_root()
    lines: list[str] = []
    folder, outcome = box.run(
        cache_root, sweep, shard, attempt, lambda f: work(f, cache_root, lines.append), say=lines.append
    )
    payload, digests = box.pack(folder)
    yield {
        "box": asdict(facts),
        "payload": payload,
        "digests": digests,
        "outcome": outcome,
        "process": process,
        "folder": str(folder),
        "lines": lines,
    }


@dataclass
class ShardResult:
    shard: str
    attempt: int
    box: dict[str, Any]
    folder: Path  # DIR/shards/<shard>: the box's folder, unpacked and checked
    outcome: Any  # the sweep runner's Outcome on the box
    process: dict[str, Any]  # niceness and OOM score of the worker, before and after normalising


def connect(address: str) -> None:
    """Join the Ray cluster at `address` as a driver (the token, where the cluster asks for one, from
    RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, as Ray reads it)."""
    try:
        import ray
    except ImportError:
        raise FleetError("--fleet needs Ray: pip install 'pytest-b70lab[fleet]'") from None
    reachable(address)
    try:
        ray.init(address=address, log_to_driver=False, namespace="b70lab", configure_logging=False)
    except Exception as e:  # Ray's connection errors share no base class: say the first line
        raise FleetError(
            f"cannot join the Ray cluster at {address}: {str(e).splitlines()[0] if str(e) else e!r}"
        ) from e


def reachable(address: str, timeout_s: float = 5.0) -> None:
    """A FleetError at once where nothing answers at HOST:PORT: Ray's own client retries for minutes."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise FleetError(f"--fleet {address!r}: give the head's address as HOST:PORT (its GCS port, 6379 by default)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise FleetError(
            f"nothing answers at {address} ({e.strerror or e}): is the head's `ray start --head` running, and is "
            "the port open from here? (docs/fleet.md)"
        ) from None


def disconnect() -> None:
    """Leave the cluster (the boxes and their Ray nodes stay up)."""
    import ray

    ray.shutdown()


def run_shards(
    sweep: str,
    shards: list[Shard],
    work_of: Callable[[Shard], Any],
    out: Path,
    ledger: Ledger,
    say: Progress,
    host_class: str | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    into: str = SHARDS_DIR,
) -> dict[str, ShardResult]:
    """Every shard on a box (at most `max_attempts` attempts each), each finished one's folder unpacked into
    out/`into`/SHARD; their results. A shard lost on every attempt is a FleetError after the others have finished."""
    import ray

    task = ray.remote(num_returns="streaming", max_retries=0, retry_exceptions=False)(shard_task)
    pending: dict[Any, tuple[Shard, int]] = {}
    where: dict[tuple[str, int], dict[str, Any]] = {}
    classes = _first_host_classes(ledger)
    given_up: list[str] = []

    def submit(s: Shard) -> None:
        attempt = ledger.attempts(s.name) + 1
        wanted = host_class or classes.get(s.name)
        options: dict[str, Any] = {"resources": {box.RESOURCE: 1}, "num_cpus": 0}
        if wanted:
            options["label_selector"] = {box.CLASS_LABEL: wanted}
        generator = task.options(**options).remote(sweep, s.name, attempt, work_of(s))
        pending[generator] = (s, attempt)
        say(
            f"fleet: {s.name} attempt {attempt} submitted ({', '.join(s.variants)})"
            + (f" on class {wanted}" if wanted else "")
        )

    for s in shards:
        submit(s)
    results: dict[str, ShardResult] = {}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
        for generator in ready:
            s, attempt = pending[generator]
            try:
                item = ray.get(next(generator))
            except StopIteration:
                del pending[generator]
                continue
            except Exception as e:  # a lost box (NodeDiedError, WorkerCrashedError...) or the shard's own error
                del pending[generator]
                _lost(e, s, attempt, where.get((s.name, attempt)), ledger, say)
                if ledger.attempts(s.name) < max_attempts:
                    submit(s)
                else:
                    given_up.append(f"{s.name}: lost on all {max_attempts} attempts (DIR/{ledger.path.name})")
                continue
            if "payload" not in item:
                where[(s.name, attempt)] = item["box"]
                classes.setdefault(s.name, item["box"].get("host_class"))
                ledger.add(s.name, attempt, "started", **_box_facts(item["box"]))
                say(f"fleet: {s.name} attempt {attempt} running on {box.BoxFacts(**item['box']).line()}")
                continue
            folder = Path(out) / into / s.name
            box.unpack(item["payload"], item["digests"], folder)
            ledger.add(s.name, attempt, "finished", worker=item["process"], **_box_facts(item["box"]))
            results[s.name] = ShardResult(s.name, attempt, item["box"], folder, item["outcome"], item["process"])
            say(f"fleet: {s.name} attempt {attempt} finished on {box.BoxFacts(**item['box']).line()} -> {folder}")
    if given_up:
        raise FleetError("; ".join(given_up))
    return results


def _first_host_classes(ledger: Ledger) -> dict[str, str | None]:
    """Each shard's first attempt's host class, also from a ledger an interrupted driver left: a resumed shard runs
    again on a box of the same class."""
    classes: dict[str, str | None] = {}
    for event in ledger.events:
        if event.event == "started" and event.host_class:
            classes.setdefault(event.shard, event.host_class)
    return classes


def _box_facts(facts: dict[str, Any] | None) -> dict[str, Any]:
    if not facts:
        return {}
    return {"box": box.BoxFacts(**facts).line(), "host_class": facts.get("host_class"), "node": facts.get("node")}


def _lost(
    e: BaseException, s: Shard, attempt: int, facts: dict[str, Any] | None, ledger: Ledger, say: Progress
) -> None:
    """The ledger's line for an attempt that did not finish: `lost` where Ray lost the box or the worker,
    `failed` where the shard's own code raised (Ray's RayTaskError carries it)."""
    import ray

    own = isinstance(e, ray.exceptions.RayTaskError)
    cause: BaseException = getattr(e, "cause", None) or e if own else e
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[-1 if own else 0]
    error = f"{type(cause).__name__}: {first}"
    ledger.add(s.name, attempt, "failed" if own else "lost", error=error, **_box_facts(facts))
    where_ = box.BoxFacts(**facts).line() if facts else "no box yet"
    say(f"fleet: {s.name} attempt {attempt} {'failed' if own else 'lost'} on {where_}: {error}")
