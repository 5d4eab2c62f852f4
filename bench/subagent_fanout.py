"""Subagent fan-out: wall time for a main agent to spawn 20 subagents (one short cell
each: `time.sleep(0.5)`) and answer, with `max_subagents` 1, 5 and 20.

Two nodes with 12 task slots and 12 kernels each, so the cap (not the fleet) bounds the
parallelism up to 20. Wall time runs from `submit` to the main turn's TurnFinished; "peak"
is the most subagents running at once, from the SubagentStarted/SubagentFinished
timestamps (it must never exceed the cap).

    .venv/bin/python bench/subagent_fanout.py [--children 20] [--caps 1 5 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import redis
from _fleet import ROOT, Fleet, wait_for

from actfleet.broker.events import Event, SubagentFinished, SubagentStarted
from actfleet.client import Client

CELL = "import time; time.sleep(0.5); print('done')"


def start_node(fleet: Fleet, name: str) -> None:
    env = {
        **os.environ,
        "ACTFLEET_REDIS_URL": fleet.redis_url,
        "ACTFLEET_WORKDIR": str(fleet.dir / "work"),
        "ACTFLEET_WARM_KERNELS": "4",
    }
    log = open(fleet.log_path(name), "wb")  # noqa: SIM115 - lives with the process
    fleet.procs[name] = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "actfleet",
            "worker",
            "--name",
            name,
            "--concurrency",
            "12",
            "--kernels",
            "12",
            "--loglevel",
            "WARNING",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    conn = redis.Redis.from_url(fleet.redis_url)
    wait_for(lambda: conn.exists(f"actfleet:node:{name}"), 60, f"node {name}")


def peak(events: list[Event]) -> int:
    marks = sorted(
        [(e.ts, 1) for e in events if isinstance(e, SubagentStarted)]
        + [(e.ts, -1) for e in events if isinstance(e, SubagentFinished)]
    )
    running = most = 0
    for _, step in marks:
        running += step
        most = max(most, running)
    return most


def main(children: int, caps: list[int]) -> None:
    fleet = Fleet("bench-fanout-", deadline=600)
    fleet.start_redis()
    for name in ("fan-1", "fan-2"):
        start_node(fleet, name)
    try:
        client = Client(fleet.redis_url)
        replay = Path(fleet.dir) / "fanout.jsonl"
        spawn = {
            "tool_calls": [
                {"name": "subagent_task", "args": {"prompt": f"task {i}"}} for i in range(children)
            ]
        }
        lines = [
            spawn,
            {"text": "done"},
            {"agent": "sub", "code": CELL},
            {"agent": "sub", "text": "ok"},
        ]
        replay.write_text("".join(json.dumps(line) + "\n" for line in lines))
        warm = client.submit(
            "warm up", model=f"replay:{replay}", approval="auto", max_subagents=children
        )
        client.wait(warm, timeout=300)
        print(f"fan-out of {children} subagents (one {CELL!r} cell each), 2 nodes x 12 slots")
        print(f"{'cap':>5} {'wall s':>8} {'peak':>6} {'ideal s':>8}")
        for cap in caps:
            started = time.time()
            handle = client.submit(
                "fan out", model=f"replay:{replay}", approval="auto", max_subagents=cap
            )
            result = client.wait(handle, timeout=300)
            wall = time.time() - started
            assert result.status == "finished", result
            events = list(client.events(handle.session_id, follow=False))
            ideal = -(-children // cap) * 0.5
            print(f"{cap:>5} {wall:>8.2f} {peak(events):>6} {ideal:>8.1f}")
    finally:
        fleet.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=20)
    parser.add_argument("--caps", type=int, nargs="+", default=[1, 5, 20])
    args = parser.parse_args()
    main(args.children, args.caps)
