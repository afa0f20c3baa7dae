"""Issue 50's done-when: the same sweep run over a local two-box Ray cluster (`b70lab sweep --fleet`) and on one box
without Ray, alternating (fleet, one box, one box, fleet, ...) so that the machine's drift falls on both alike; then
each variant's verdict and paired figure side by side. Both arms run with the cluster up (idle during the one-box
sweeps), inside a network namespace that holds only loopback, as tests/fleet/ runs its clusters:

    mkdir -p /tmp/b70fc && B70LAB_CACHE_DIR=$PWD/data/cache RAY_TMPDIR=/tmp/b70fc HOME=/tmp/b70fc/home \\
        RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(openssl rand -hex 16) unshare -rn sh -c 'ip link set lo up && \\
        exec .venv/bin/python scripts/fleet_compare.py /tmp/b70fc data/fleet-compare --repeats 3'

(`unshare -n` as root.) Both arms use the cache root B70LAB_CACHE_DIR names (HOME is Ray's, so name it): two Ray
nodes on one machine share its mini and compile caches, and its machine lock measures one shard at a time (fleet/box.py). Writes OUT/summary.json."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def start_cluster(work: Path):  # type: ignore[no-untyped-def]
    """A head (no box resource) and two box nodes on 127.0.0.1, started as the fleet tests start theirs (and as
    `b70lab fleet labels` says), sharing the caller's cache root."""
    sys.path.insert(0, str(REPO / "tests" / "fleet"))
    from ray_netns import start_cluster as start

    from pytest_b70lab.mini.build import default_cache_root

    cache = default_cache_root()
    cluster, _ = start(work, {"box-a": cache, "box-b": cache})
    return cluster


def sweep(args: argparse.Namespace, out: Path, fleet: str | None) -> dict:
    command = [str(Path(sys.executable).parent / "b70lab"), "sweep", "--contract", args.contract]
    for vary in args.vary:
        command += ["--vary", vary]
    command += ["--rounds", str(args.rounds), "--out", str(out)]
    if fleet:
        command += ["--fleet", fleet]
    t0 = time.monotonic()
    with open(out.with_suffix(".log"), "w") as log:
        done = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return {"command": command[1:], "returncode": done.returncode, "wall_s": round(time.monotonic() - t0, 1)}


def rows_of(out: Path) -> list[dict]:
    try:
        document = json.loads((out / "sweep.json").read_text())
    except (OSError, ValueError) as e:
        return [{"error": f"{out / 'sweep.json'}: {e}"}]
    found = []
    for row in document.get("variants", []):
        paired = row.get("paired_to_base") or {}
        found.append(
            {
                "variant": row["variant"],
                "shard": row.get("shard"),
                "boxes": sorted({s["box"] for s in row["starts"] if s.get("box")}),
                "verdict": row["verdict"],
                "verdict_line": row["verdict_line"],
                "paired": paired.get("ratio"),
                "interval": [paired.get("low"), paired.get("high")],
                "measured": row["measured"],
            }
        )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="Ray's folder (short: its socket paths must fit 107 bytes)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--contract", default="mini-laguna-cpu-int4")
    parser.add_argument("--vary", action="append", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.vary = args.vary or ["speculative.num_speculative_tokens=9"]
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.work / "ray").mkdir(parents=True, exist_ok=True)
    cluster = start_cluster(args.work)
    runs = []
    try:
        for i in range(1, args.repeats + 1):
            arms = ["fleet", "one-box"] if i % 2 else ["one-box", "fleet"]
            for arm in arms:
                out = args.out / f"{arm}-{i}"
                print(f"{time.strftime('%H:%M:%S')} {arm} sweep {i} -> {out}", flush=True)
                ran = sweep(args, out, cluster.address if arm == "fleet" else None)
                runs.append({"arm": arm, "repeat": i, "out": str(out), **ran, "rows": rows_of(out)})
                (args.out / "summary.json").write_text(json.dumps({"runs": runs}, indent=1))
                print(f"  rc {ran['returncode']} in {ran['wall_s']:.0f} s: {runs[-1]['rows']}", flush=True)
    finally:
        cluster.shutdown()
    summary = {"runs": runs, "by_variant": {}}
    for arm in ("fleet", "one-box"):
        for run in (r for r in runs if r["arm"] == arm):
            for row in run["rows"]:
                if "variant" in row:
                    entry = summary["by_variant"].setdefault(row["variant"], {}).setdefault(arm, [])
                    entry.append({"paired": row["paired"], "verdict": row["verdict"]})
    for arms in summary["by_variant"].values():
        means = {
            a: statistics.fmean(x["paired"] for x in v if x["paired"] is not None)
            for a, v in arms.items()
            if any(x["paired"] is not None for x in v)
        }
        if len(means) == 2:
            arms["mean_difference"] = round(means["fleet"] - means["one-box"], 4)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["by_variant"], indent=1))
    return 0


if __name__ == "__main__":
    os.environ.pop("RAY_ADDRESS", None)
    sys.exit(main())
