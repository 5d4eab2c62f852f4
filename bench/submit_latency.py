"""Submit latency: from `Client.submit` to the first execution output the client reads.

Each turn is a fresh session on an idle node whose warm pool is full, so the path is:
submit (Lua script + Celery message) -> model step (replay `print(1)`) -> execution step,
which takes a kernel from the warm pool (init code applied) and runs the cell -> the
output chunk's XADD -> the client's XREAD. The node reaps idle runtimes after 0.5 s, and the
bench waits for that and for the pool to refill before the next turn, so every turn sees
the same idle node. The clock starts on the client just before `submit` and stops when
the first CodeExecutionOutputChunk or CodeExecutionOutput is read.

    .venv/bin/python bench/submit_latency.py [--turns 30]

Target: p50 and p99 at most 150 ms.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import redis
from _fleet import Fleet, pct, wait_for

from actfleet.broker.events import (
    CodeAction,
    CodeExecutionOutput,
    CodeExecutionOutputChunk,
    TurnFinished,
    TurnStarted,
)
from actfleet.client import Client

TARGET_MS = 150.0
WARM = 2
NODE = "bench-1"


def write_replay(path: Path) -> Path:
    path.write_text(json.dumps({"code": "print(1)"}) + "\n" + json.dumps({"text": "ok"}) + "\n")
    return path


def one_turn(client: Client, model: str) -> dict[str, float]:
    """Submit one turn in a new session; the marks of its path, in s since the epoch."""
    marks = {"submit": time.time()}
    handle = client.submit("bench", model=model, approval="auto")
    marks["submit_returned"] = time.time()
    for event in client.events(handle.session_id):
        if isinstance(event, TurnStarted):
            marks["turn_started_ts"] = event.ts
        elif isinstance(event, CodeAction):
            marks["code_action_ts"] = event.ts
        elif isinstance(event, CodeExecutionOutputChunk | CodeExecutionOutput):
            if "first_output" not in marks:
                marks["first_output"] = time.time()
                marks["first_output_ts"] = event.ts
        elif isinstance(event, TurnFinished):
            return marks
        elif event.type in ("TurnFailed", "Cancelled", "ApprovalRequest"):
            raise RuntimeError(f"turn stopped: {event}")
    raise AssertionError("unreachable")


def wait_idle(fleet: Fleet, conn: redis.Redis) -> None:
    """Until the node holds no runtime and its pool has WARM idle kernels."""
    wait_for(lambda: not conn.scard(f"actfleet:nodeagents:{NODE}"), 30, "runtimes reaped")
    fleet.wait_warm(NODE, WARM)


def main(turns: int, warmup: int, loglevel: str) -> None:
    fleet = Fleet("bench-submit-")
    fleet.start_redis()
    fleet.start_worker(
        NODE,
        warm_kernels=WARM,
        loglevel=loglevel,
        ACTFLEET_RUNTIME_IDLE_TIMEOUT="0.5",
        ACTFLEET_HEARTBEAT_INTERVAL="0.25",
    )
    conn = redis.Redis.from_url(fleet.redis_url)
    client = Client(fleet.redis_url)
    model = f"replay:{write_replay(fleet.dir / 'print.jsonl')}"
    runs: list[dict[str, float]] = []
    for i in range(warmup + turns):
        wait_idle(fleet, conn)
        marks = one_turn(client, model)
        if i >= warmup:
            runs.append(marks)
    client.close()
    conn.close()
    fleet.stop()

    def ms(a: str, b: str) -> list[float]:
        return [(r[b] - r[a]) * 1000 for r in runs]

    rows = [
        ("submit -> first output read (client clock)", ms("submit", "first_output")),
        ("  submit() call returns", ms("submit", "submit_returned")),
        ("  submit -> CodeAction (model step)", ms("turn_started_ts", "code_action_ts")),
        ("  CodeAction -> first output (exec step)", ms("code_action_ts", "first_output_ts")),
        ("  first output stamped -> read by client", ms("first_output_ts", "first_output")),
    ]
    print(f"{turns} turns in fresh sessions, idle node, {WARM} warm kernels, ms")
    print(f"{'':<46}{'p50':>8}{'p99':>8}{'max':>8}")
    for name, values in rows:
        print(f"{name:<46}{pct(values, 50):>8.1f}{pct(values, 99):>8.1f}{max(values):>8.1f}")
    total = rows[0][1]
    verdicts = [f"{q} {'met' if pct(total, q) <= TARGET_MS else 'MISSED'}" for q in (50, 99)]
    print(f"target <= {TARGET_MS:g} ms: {', '.join(f'p{v}' for v in verdicts)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--loglevel", default="WARNING", help="worker log level")
    args = parser.parse_args()
    main(args.turns, args.warmup, args.loglevel)
