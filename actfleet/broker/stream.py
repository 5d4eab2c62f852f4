"""Writing events to a session's stream, and reading them back from a cursor.

`seq` is assigned inside Redis by the same script that appends the entry, so the stream's
order and `seq` agree and `seq` has no gaps. The stream id is the resume cursor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from actfleet.broker.events import Event, Unreadable, decode, encode
from actfleet.broker.keys import Keys
from actfleet.broker.scripts import script


def stamp(event: Event) -> Event:
    """The event with `ts` set to now when it has none."""
    if event.ts:
        return event
    return type(event)(**{**_fields(event), "ts": time.time()})


def _fields(event: Event) -> dict[str, Any]:
    data = event.to_dict()
    del data["type"]
    return data


async def emit(redis: Any, keys: Keys, maxlen: int, events: list[Event]) -> list[str]:
    """Append events to their session's stream (all of one session), atomically, in order."""
    if not events:
        return []
    session_id = events[0].session_id
    blobs = [encode(stamp(e)) for e in events]
    ids = await script("emit").arun(
        redis, [keys.seq(session_id), keys.stream(session_id)], [maxlen, *blobs]
    )
    return [i.decode() if isinstance(i, bytes) else i for i in ids]


class ChunkCoalescer:
    """Buffers chunk text per (type, corr_id) and writes it every few tens of ms or KB,
    so a fast token stream does not become one Redis command per token."""

    def __init__(self, redis: Any, keys: Keys, maxlen: int, flush_ms: int, flush_bytes: int):
        self._redis, self._keys, self._maxlen = redis, keys, maxlen
        self._flush_s, self._flush_bytes = flush_ms / 1000, flush_bytes
        self._pending: list[Event] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Task[None] | None = None

    def add(self, event: Event, text: str) -> None:
        """Queue a chunk event whose payload is `text` (merged with a queued twin)."""
        last = self._pending[-1] if self._pending else None
        if last is not None and type(last) is type(event) and last.corr_id == event.corr_id:
            attr = "text" if hasattr(event, "text") else "content"
            merged = _fields(last) | {attr: getattr(last, attr) + text}
            self._pending[-1] = type(event)(**merged)
        else:
            self._pending.append(stamp(event))
        self._size += len(text)
        if self._size >= self._flush_bytes:
            self._schedule(0)
        elif self._timer is None:
            self._schedule(self._flush_s)

    def _schedule(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(delay, self._start_write)

    def _start_write(self) -> None:
        self._timer = None
        if self._writing is None or self._writing.done():
            self._writing = asyncio.ensure_future(self._write())
        else:
            self._schedule(self._flush_s)

    async def _write(self) -> None:
        batch, self._pending, self._size = self._pending, [], 0
        await emit(self._redis, self._keys, self._maxlen, batch)

    async def flush(self) -> None:
        """Write everything queued; returns when it is in the stream."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writing is not None:
            await self._writing
        if self._pending:
            await self._write()


def entries_to_events(session_id: str, entries: list[Any]) -> list[Event]:
    """The events of stream entries; an entry that is not an event becomes `Unreadable`
    (with the reason), so one junk entry never stops a reader."""
    events: list[Event] = []
    for stream_id, fields in entries:
        sid = stream_id.decode() if isinstance(stream_id, bytes) else str(stream_id)
        seq = fields.get(b"seq", b"")
        try:
            if b"e" not in fields or not seq.isdigit():
                raise ValueError(f"stream entry {sid} has no event and seq")
            events.append(decode(fields[b"e"], seq=int(seq), stream_id=sid))
        except ValueError as exc:
            events.append(Unreadable(session_id=session_id, agent_id="", id=sid, reason=str(exc)))
    return events


def read_events(
    redis: Any,
    keys: Keys,
    session_id: str,
    after: str | None = None,
    *,
    follow: bool = True,
    block_ms: int = 1000,
) -> Iterator[Event]:
    """The session's events after cursor `after` ("0" or None: from the start); with
    `follow`, waits for new ones forever."""
    cursor = after or "0-0"
    key = keys.stream(session_id)
    while True:
        reply = redis.xread({key: cursor}, count=500, block=block_ms if follow else None)
        if not reply:
            if follow:
                continue
            return
        events = entries_to_events(session_id, reply[0][1])
        yield from events
        cursor = events[-1].id
        if not follow and len(events) < 500:
            return


async def aread_events(
    redis: Any,
    keys: Keys,
    session_id: str,
    after: str | None = None,
    *,
    follow: bool = True,
    block_ms: int = 1000,
) -> AsyncIterator[Event]:
    """`read_events` for asyncio clients (redis.asyncio)."""
    cursor = after or "0-0"
    key = keys.stream(session_id)
    while True:
        reply = await redis.xread({key: cursor}, count=500, block=block_ms if follow else None)
        if not reply:
            if follow:
                continue
            return
        events = entries_to_events(session_id, reply[0][1])
        for event in events:
            yield event
        cursor = events[-1].id
        if not follow and len(events) < 500:
            return
