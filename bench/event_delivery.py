"""Event delivery: from a worker's XADD to a following client, no worker in the path.

A writer emits events with `actfleet.broker.stream.emit` (async, the workers' path), one
event per call, each stamped with `ts` just before the call. A reader in another process
follows the stream with `read_events` (the SDK's `Client.events`) and records, per event,
`receive_time - ts`: the Lua script (INCR + XADD), the blocked XREAD waking, msgpack decode.
Two cases: a steady rate (events spaced evenly), and a burst (emits back to back, no pause).

    .venv/bin/python bench/event_delivery.py [--events 2000] [--rate 500]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import time
from multiprocessing.connection import Connection

import redis
import redis.asyncio as aioredis
from _fleet import Fleet, pct

from actfleet.broker.events import ResponseChunk
from actfleet.broker.keys import Keys
from actfleet.broker.settings import Settings
from actfleet.broker.stream import emit, read_events

CONTENT = "x" * 64
"""A token-sized chunk of text, as a coalesced ResponseChunk carries."""


def reader(url: str, session_id: str, count: int, ready: Connection, out: Connection) -> None:
    """Follow the session's stream; send back one delay (ms) per event."""
    conn = redis.Redis.from_url(url)
    conn.ping()
    ready.send(True)
    delays = []
    for event in read_events(conn, Keys(), session_id, None, follow=True):
        delays.append((time.time() - event.ts) * 1000)
        if len(delays) == count:
            break
    out.send(delays)
    conn.close()


async def write(url: str, session_id: str, count: int, rate: float | None) -> float:
    """Emit `count` events, evenly spaced at `rate` per second (None: back to back);
    returns the seconds it took."""
    conn = aioredis.Redis.from_url(url)
    keys, maxlen = Keys(), Settings().stream_maxlen
    start = time.perf_counter()
    for i in range(count):
        if rate is not None:
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        event = ResponseChunk(session_id=session_id, content=CONTENT, ts=time.time())
        await emit(conn, keys, maxlen, [event])
    elapsed = time.perf_counter() - start
    await conn.aclose()
    return elapsed


def run_case(
    url: str, session_id: str, count: int, rate: float | None
) -> tuple[list[float], float]:
    ctx = mp.get_context("spawn")
    ready_r, ready_w = ctx.Pipe(duplex=False)
    out_r, out_w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=reader, args=(url, session_id, count, ready_w, out_w))
    proc.start()
    try:
        if not ready_r.poll(30):
            raise TimeoutError("reader did not start")
        ready_r.recv()
        time.sleep(0.2)  # let the reader's first XREAD block before anything is written
        elapsed = asyncio.run(write(url, session_id, count, rate))
        if not out_r.poll(60):
            raise TimeoutError("reader did not receive every event")
        delays: list[float] = out_r.recv()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return delays, elapsed


def main(count: int, rate: float) -> None:
    fleet = Fleet("bench-events-")
    url = fleet.start_redis()
    cases = [(f"steady, {rate:g}/s", rate), ("burst, back to back", None)]
    print(f"{count} ResponseChunk events per case, emit -> read_events in another process, ms")
    print(f"{'':<24}{'p50':>8}{'p99':>8}{'max':>8}{'events/s':>10}")
    for i, (name, case_rate) in enumerate(cases):
        asyncio.run(write(url, f"warmup-{i}", 200, None))  # connections, scripts cached
        delays, elapsed = run_case(url, f"bench-{i}", count, case_rate)
        print(
            f"{name:<24}{pct(delays, 50):>8.2f}{pct(delays, 99):>8.2f}{max(delays):>8.2f}"
            f"{count / elapsed:>10.0f}"
        )
    fleet.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=500, help="events/s in the steady case")
    args = parser.parse_args()
    main(args.events, args.rate)
