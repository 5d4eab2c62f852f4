"""Cancel latency: from `Client.cancel` to every agent of the session reporting Cancelled.

Each run is a fresh session: the main agent spawns 3 subagents, each of which prints a line
and sleeps 60 s in its cell; once the client has read all three lines (every cell runs, on
either of two nodes), it calls `cancel`. The clock starts on the client just before
`cancel`; the Cancelled events' `ts` are stamped by the nodes that commit them (same
machine), and the last one is also timed when the client reads it. Between runs the bench
waits until the nodes hold no runtime (reaped after 0.5 s idle), no subagent slot is held
and their warm pools are full and idle, so every run sees the same idle fleet. This is the
timing that tests/test_subagents.py used to assert (`< 2 s`); the test now checks the order.

    .venv/bin/python bench/cancel_latency.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import redis
from _fleet import Fleet, pct, wait_for

from actfleet.broker.events import Cancelled, CodeExecutionOutputChunk
from actfleet.client import Client

NODES = ("cancel-1", "cancel-2")
WARM = 4
SUBAGENTS = 3
CELL = "import time; print('running', flush=True); time.sleep(60)"


def write_replay(path: Path) -> Path:
    spawn = {
        "tool_calls": [
            {"name": "subagent_task", "args": {"prompt": f"task {i}"}} for i in range(SUBAGENTS)
        ]
    }
    lines = [spawn, {"text": "n/a"}, {"agent": "sub", "code": CELL}, {"agent": "sub", "text": "-"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def one_run(client: Client, model: str) -> dict[str, list[float]]:
    """Cancel one session whose subagents' cells all run; the delays from the call, in s."""
    handle = client.submit("fan out", model=model, approval="auto")
    running: set[str] = set()
    for event in client.events(handle.session_id):
        if isinstance(event, CodeExecutionOutputChunk):
            running.add(event.agent_id)
            if len(running) == SUBAGENTS:
                break
    cursor = event.id
    called = time.time()
    client.cancel(handle.session_id)
    cancelled: list[Cancelled] = []
    for event in client.events(handle.session_id, cursor):
        if isinstance(event, Cancelled):
            cancelled.append(event)
            if len(cancelled) == SUBAGENTS + 1:
                break
    read = time.time()
    return {
        "last": [max(e.ts for e in cancelled) - called],
        "sub": [e.ts - called for e in cancelled if e.agent_id != "main"],
        "main": [e.ts - called for e in cancelled if e.agent_id == "main"],
        "read": [read - called],
    }


def slots_held(conn: redis.Redis) -> int:
    return sum(conn.zcard(k) for k in conn.scan_iter("actfleet:slots*"))


def wait_idle(fleet: Fleet, conn: redis.Redis) -> None:
    """Until no node holds a runtime or a slot and every pool has WARM idle kernels."""
    for node in NODES:
        wait_for(lambda n=node: not conn.scard(f"actfleet:nodeagents:{n}"), 30, "runtimes reaped")
    wait_for(lambda: slots_held(conn) == 0, 30, "subagent slots freed")
    for node in NODES:
        fleet.wait_warm(node, WARM)


def main(runs: int, warmup: int) -> None:
    fleet = Fleet("bench-cancel-", deadline=120 + 30 * (runs + warmup))
    fleet.start_redis()
    for node in NODES:
        fleet.start_worker(
            node,
            warm_kernels=WARM,
            ACTFLEET_RUNTIME_IDLE_TIMEOUT="0.5",
            ACTFLEET_HEARTBEAT_INTERVAL="0.25",
        )
    conn = redis.Redis.from_url(fleet.redis_url)
    client = Client(fleet.redis_url)
    model = f"replay:{write_replay(fleet.dir / 'cancel.jsonl')}"
    delays: dict[str, list[float]] = {"last": [], "sub": [], "main": [], "read": []}
    try:
        for i in range(warmup + runs):
            wait_idle(fleet, conn)
            run = one_run(client, model)
            if i >= warmup:
                for name, values in run.items():
                    delays[name] += values
    finally:
        client.close()
        conn.close()
        fleet.stop()

    rows = [
        ("cancel -> last Cancelled stamped (node clock)", delays["last"]),
        ("  each subagent's Cancelled", delays["sub"]),
        ("  the main agent's Cancelled", delays["main"]),
        ("cancel -> last Cancelled read by the client", delays["read"]),
    ]
    print(f"{runs} runs: main agent + {SUBAGENTS} subagents in running cells, 2 nodes, ms")
    print(f"{'':<48}{'p50':>8}{'p95':>8}{'max':>8}")
    for name, values in rows:
        ms = [v * 1000 for v in values]
        print(f"{name:<48}{pct(ms, 50):>8.1f}{pct(ms, 95):>8.1f}{max(ms):>8.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    main(args.runs, args.warmup)
