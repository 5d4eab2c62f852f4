"""The wire: event codec, Redis-assigned seq, coalesced chunks, resumable reads, turn state."""

from __future__ import annotations

import asyncio
import dataclasses

import redis
import redis.asyncio as aioredis

from actfleet.broker import events as ev
from actfleet.broker.keys import Keys
from actfleet.broker.state import claim_step, commit_step, submit_turn
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


def test_a_turn_submitted_while_another_runs_starts_when_it_ends(redis_url: str):
    r = redis.Redis.from_url(redis_url)
    for turn in ("t1", "t2"):
        started = ev.TurnStarted(session_id="s", turn_id=turn, prompt=turn, model="m")
        state = submit_turn(
            r, KEYS, 1000, turn_id=turn, started=started, now=1.0, fields={"prompt": turn}
        )
        assert state == ("started" if turn == "t1" else "queued")

    async def main() -> tuple[bool, str, str]:
        conn = aioredis.Redis.from_url(redis_url)
        assert await claim_step(conn, KEYS, "t1:1:model", "n", "boot") == ("ok", "")
        done = ev.TurnFinished(session_id="s", turn_id="t1")
        result = await commit_step(
            conn,
            KEYS,
            1000,
            sid="t1:1:model",
            session_id="s",
            agent_id="main",
            turn_id="t1",
            history=[b"{}"],
            events=[done],
            turn_fields={"status": "finished"},
            terminal=True,
        )
        again = await commit_step(
            conn,
            KEYS,
            1000,
            sid="t1:1:model",
            session_id="s",
            agent_id="main",
            turn_id="t1",
            history=[b"{}"],
            events=[done],
            turn_fields={},
            terminal=True,
        )
        assert again == (False, "", "")
        await conn.aclose()
        return result

    assert asyncio.run(main()) == (True, "t2", "")
    types = [(e.type, e.turn_id) for e in read_events(r, KEYS, "s", follow=False)]
    assert types == [("TurnStarted", "t1"), ("TurnFinished", "t1"), ("TurnStarted", "t2")]
    assert r.llen(KEYS.history("s", "main")) == 1


def test_a_step_claimed_by_a_live_node_is_busy_and_by_a_dead_one_is_taken_over(redis_url):
    r = redis.Redis.from_url(redis_url)
    r.set(KEYS.node("a"), "boot-a")

    async def main() -> None:
        conn = aioredis.Redis.from_url(redis_url)
        assert await claim_step(conn, KEYS, "t:2:execution", "a", "boot-a") == ("ok", "")
        assert await claim_step(conn, KEYS, "t:2:execution", "b", "boot-b") == ("busy", "a")
        await conn.delete(KEYS.node("a"))
        assert await claim_step(conn, KEYS, "t:2:execution", "b", "boot-b") == ("ok", "a")
        await conn.aclose()

    asyncio.run(main())
