"""`b70lab fleet labels`: what a box's Ray node is started with, so that a fleet sweep finds it, names it and
measures on it as it measures without Ray (docs/fleet.md)."""

from __future__ import annotations

import argparse
import json
import shlex

# What a box's Ray node must set so that the engines it runs are measured as without Ray (fleet/box.py checks the
# first two in every shard and puts a worker back where it may; the memory monitor would kill an engine instead of
# letting the lab's own OOM accounting name it).
BOX_NODE_ENVIRONMENT = {
    "RAY_worker_niceness": "0",
    "RAY_worker_oom_score_adjustment": "0",
    "RAY_memory_monitor_refresh_ms": "0",
    "RAY_AUTH_MODE": "token",
}


def add(sub: argparse._SubParsersAction) -> None:
    fleet_p = sub.add_parser("fleet", help="a fleet of boxes on Ray for `b70lab sweep --fleet` (docs/fleet.md)")
    fleet_sub = fleet_p.add_subparsers(dest="fleet_command", metavar="COMMAND", required=True)
    labels_p = fleet_sub.add_parser(
        "labels",
        help="the `ray start` line that joins the box it runs on to a fleet: its label, host class and resource",
    )
    labels_p.add_argument("name", help="the box's name, as rows and the ledger will show it (b70-01, say)")
    labels_p.add_argument("--head", default="HEAD:6379", help="the head's address (default: a placeholder)")
    labels_p.set_defaults(func=_labels)


def _labels(args: argparse.Namespace) -> int:
    from ..fleet import box

    labels = f"{box.BOX_LABEL}={args.name},{box.CLASS_LABEL}={box.class_key()}"
    env = " ".join(f"{k}={v}" for k, v in BOX_NODE_ENVIRONMENT.items())
    resources = json.dumps({box.RESOURCE: 1})
    print(
        f"{env} RAY_AUTH_TOKEN_PATH=<the lab's token file> ray start --address {args.head} "
        f"--resources {shlex.quote(resources)} --labels {labels} --num-cpus 1 --object-store-memory 100000000 "
        "--include-dashboard false"
    )
    return 0
