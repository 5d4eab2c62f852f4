"""Per-step overhead of a turn: what Redis, Celery and a worker add around each kernel cell.

A replay turn of N code actions (`x = 1`) and a final text line runs end to end through a
private Redis and one worker. A step here is one model step plus one execution step (one
code action and its cell); its duration is the time between consecutive
CodeExecutionOutput events (their `ts` is stamped by the worker when it commits the
execution step). Beside it, in the same run, the same N cells run directly on a kernel from
`KernelPool` (`Kernel.execute`), so the difference is the overhead per step.

    .venv/bin/python bench/step_overhead.py [--steps 100]

Target: p50 per step at most 15 ms above the raw cell.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import redis
from _fleet import Fleet, pct

from actfleet.broker.events import CodeAction, CodeExecutionOutput, TurnFinished
from actfleet.client import Client
from actfleet.workers.kernel import Kernel
from actfleet.workers.kernel_pool import KernelPool

CODE = "x = 1"
TARGET_MS = 15.0


async def raw_cells(steps: int, warmup: int) -> list[float]:
    """ms per `Kernel.execute(CODE)` on a pool kernel, after `warmup` cells."""
    with tempfile.TemporaryDirectory(prefix="bench-raw-") as workdir:
        async with KernelPool(1, 1) as pool:
            kernel = await pool.acquire(Path(workdir))
            return await _time_cells(kernel, steps, warmup)


async def _time_cells(kernel: Kernel, steps: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        result = await kernel.execute(CODE)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1000)
        assert result.status == "ok", result.text
    return times


def write_replay(path: Path, steps: int) -> Path:
    lines = [{"code": CODE}] * steps + [{"text": "done"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run_turn(client: Client, replay: Path) -> tuple[list[float], list[float], float]:
    """Run one turn; returns the ts of each CodeAction and CodeExecutionOutput, and the
    wall time from submit to TurnFinished at the client (s)."""
    start = time.time()
    handle = client.submit("bench", model=f"replay:{replay}", approval="auto")
    actions: list[float] = []
    outputs: list[float] = []
    for event in client.events(handle.session_id):
        if isinstance(event, CodeAction):
            actions.append(event.ts)
        elif isinstance(event, CodeExecutionOutput):
            assert event.status == "ok", event.text
            outputs.append(event.ts)
        elif isinstance(event, TurnFinished):
            return actions, outputs, time.time() - start
        elif event.type in ("TurnFailed", "Cancelled", "ApprovalRequest"):
            raise RuntimeError(f"turn stopped: {event}")
    raise AssertionError("unreachable")


def command_counts(client: Client) -> Counter[str]:
    """Calls per Redis command so far (INFO commandstats), without the INFO calls."""
    stats = client.redis.info("commandstats")
    counts = Counter({name.removeprefix("cmdstat_"): s["calls"] for name, s in stats.items()})
    counts["info"] = 0
    return counts


class CommandLog:
    """Every command Redis runs while open (MONITOR), split into round trips from clients
    and commands run inside Lua scripts."""

    def __init__(self, client: Client) -> None:
        self.sent: Counter[str] = Counter()
        self.scripted: Counter[str] = Counter()
        self._monitor = client.redis.monitor()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(redis.ConnectionError, AttributeError):
            for command in self._monitor.listen():
                name = command["command"].split(" ", 1)[0].lower()
                if name in ("info", "monitor"):
                    continue
                (self.scripted if command["client_type"] == "lua" else self.sent)[name] += 1

    def close(self) -> None:
        self._monitor.__exit__()
        self._thread.join(5)


def main(steps: int, loglevel: str) -> None:
    raw = asyncio.run(raw_cells(steps, warmup=10))

    fleet = Fleet("bench-steps-")
    fleet.start_redis()
    fleet.start_worker("bench-1", warm_kernels=2, loglevel=loglevel)
    client = Client(fleet.redis_url)
    run_turn(client, write_replay(fleet.dir / "warmup.jsonl", 5))  # imports, first kernel
    fleet.wait_warm("bench-1", 3)  # the warm-up session's kernel and 2 warm ones, idle
    before = command_counts(client)
    actions, outputs, wall = run_turn(client, write_replay(fleet.dir / "turn.jsonl", steps))
    commands = command_counts(client) - before
    log = CommandLog(client)
    run_turn(client, write_replay(fleet.dir / "monitored.jsonl", steps))
    log.close()
    client.close()
    fleet.stop()

    per_step = [(b - a) * 1000 for a, b in zip(outputs, outputs[1:], strict=False)]
    # Model half: previous output committed -> code action committed (model step, 2 hops);
    # execution half: code action committed -> output committed (execution step with cell).
    model_half = [(a - o) * 1000 for o, a in zip(outputs, actions[1:], strict=False)]
    exec_half = [(o - a) * 1000 for a, o in zip(actions, outputs, strict=True)]
    tenth = max(1, len(per_step) // 10)

    def row(name: str, values: list[float]) -> str:
        return f"{name:<44}{pct(values, 50):>8.2f}{pct(values, 99):>8.2f}"

    print(f"turn of {steps} `{CODE}` code actions + final text, 1 worker, ms")
    print(f"{'':<44}{'p50':>8}{'p99':>8}")
    print(row("raw cell (KernelPool kernel, Kernel.execute)", raw))
    print(row("per step via Redis + worker", per_step))
    print(row("  model half (output -> next code action)", model_half))
    print(row("  execution half (code action -> output)", exec_half))
    print(
        f"per step p50, first {tenth} / last {tenth} steps: "
        f"{statistics.median(per_step[:tenth]):.2f} / {statistics.median(per_step[-tenth:]):.2f}"
    )
    print(f"turn wall time at the client: {wall:.2f} s ({wall / steps * 1000:.1f} ms per step)")
    total = commands.total()
    top = ", ".join(f"{name} {count / steps:.1f}" for name, count in commands.most_common(8))
    print(
        f"Redis commands per step (INFO commandstats around the turn, all clients, heartbeats "
        f"included): {total / steps:.1f}; per step by command: {top}"
    )
    sent, scripted = log.sent.total(), log.scripted.total()
    top = ", ".join(f"{name} {count / steps:.1f}" for name, count in log.sent.most_common(30))
    print(
        f"of which, in a second turn watched with MONITOR: {sent / steps:.1f} sent by clients "
        f"(round trips) and {scripted / steps:.1f} run inside Lua scripts; sent per step: {top}"
    )
    overhead = pct(per_step, 50) - pct(raw, 50)
    verdict = "met" if overhead <= TARGET_MS else "MISSED"
    print(
        f"overhead per step (p50 - raw p50): {overhead:.2f} ms; target <= {TARGET_MS:g}: {verdict}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--loglevel", default="WARNING", help="worker log level")
    args = parser.parse_args()
    main(args.steps, args.loglevel)
