"""The wire: event codec, Redis-assigned seq, coalesced chunks, resumable reads, junk entries."""

from __future__ import annotations

import asyncio
import dataclasses

import redis
import redis.asyncio as aioredis

from actfleet.broker import events as ev
from actfleet.broker.keys import Keys
from actfleet.broker.stream import ChunkCoalescer, emit, read_events

KEYS = Keys()


def test_event_round_trips_through_msgpack_with_its_stream_id_and_seq():
    event = ev.CodeExecutionOutput(
        session_id="s",
        turn_id="t",
        corr_id="c",
        text="hi",
        images=["abc"],
        truncated=True,
        node="n1",
        ts=1.5,
    )
    back = ev.decode(ev.encode(event), seq=7, stream_id="1-0")
    assert back == dataclasses.replace(event, seq=7, id="1-0")


def test_seq_counts_from_one_without_gaps_across_writers(redis_url: str):
    async def write(n: int) -> None:
        conn = aioredis.Redis.from_url(redis_url)
        for i in range(n):
            await emit(conn, KEYS, 1000, [ev.Response(session_id="s", content=str(i))])
        await conn.aclose()

    async def main() -> None:
        await asyncio.gather(write(50), write(50), write(50))

    asyncio.run(main())
    seqs = [e.seq for e in read_events(redis.Redis.from_url(redis_url), KEYS, "s", follow=False)]
    assert seqs == list(range(1, 151))


def test_fast_chunks_are_coalesced_into_few_entries_with_all_text(redis_url: str):
    async def main() -> None:
        conn = aioredis.Redis.from_url(redis_url)
        chunks = ChunkCoalescer(conn, KEYS, 1000, flush_ms=40, flush_bytes=4096)
        for i in range(1000):
            chunks.add(ev.ResponseChunk(session_id="s", corr_id="c", content=f"{i},"), f"{i},")
        await chunks.flush()
        await conn.aclose()

    asyncio.run(main())
    got = list(read_events(redis.Redis.from_url(redis_url), KEYS, "s", follow=False))
    assert len(got) < 10
    assert "".join(e.content for e in got) == "".join(f"{i}," for i in range(1000))


def test_reading_after_a_cursor_misses_nothing_and_repeats_nothing(redis_url: str):
    r = redis.Redis.from_url(redis_url)

    async def main() -> None:
        conn = aioredis.Redis.from_url(redis_url)
        await emit(
            conn, KEYS, 10_000, [ev.Response(session_id="s", content=str(i)) for i in range(1200)]
        )
        await conn.aclose()

    asyncio.run(main())
    everything = list(read_events(r, KEYS, "s", follow=False))
    assert len(everything) == 1200
    after = list(read_events(r, KEYS, "s", everything[599].id, follow=False))
    assert after == everything[600:]


def test_a_junk_stream_entry_is_read_as_a_notice_between_the_other_events(redis_url: str):
    r = redis.Redis.from_url(redis_url)

    async def write(content: str) -> None:
        conn = aioredis.Redis.from_url(redis_url)
        await emit(conn, KEYS, 1000, [ev.Response(session_id="s", content=content)])
        await conn.aclose()

    asyncio.run(write("before"))
    r.xadd(KEYS.stream("s"), {"seq": "7", "e": b"\xc1 not msgpack"})
    r.xadd(KEYS.stream("s"), {"other": "field"})
    asyncio.run(write("after"))
    got = list(read_events(r, KEYS, "s", follow=False))
    assert [e.type for e in got] == ["Response", "Unreadable", "Unreadable", "Response"]
    assert [e.content for e in got if isinstance(e, ev.Response)] == ["before", "after"]
    assert "not msgpack" in got[1].reason and "no event" in got[2].reason
