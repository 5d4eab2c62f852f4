"""Batches from the client: submit a file of items (checked whole first, then written in
chunks, never held in memory at once), follow progress, read results in completion order
from any machine, cancel."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actfleet.broker import batches, transitions
from actfleet.broker.batches import (
    CHUNK,
    BatchFileError,
    BatchItem,
    BatchOptions,
    BatchRecord,
    result_line,
)
from actfleet.broker.events import TurnStarted
from actfleet.broker.records import StepRef, TurnRecord
from actfleet.broker.transitions import text

if TYPE_CHECKING:
    from actfleet.client.sdk import Client


class UnknownBatch(LookupError):
    """No batch of that id in this Redis."""

    def __init__(self, batch: str):
        super().__init__(
            f"no batch {batch!r} in this Redis: `actfleet batch list` shows the batches, and "
            "a batch's id is b-<its name>"
        )


@dataclass(frozen=True)
class BatchProgress:
    """Where a batch stands: its record plus the items queued, running and parked."""

    record: BatchRecord
    queued: int
    running: int
    parked: int
    """Items waiting for an approval (they hold no concurrency slot)."""
    at: float

    @property
    def finished(self) -> bool:
        """Nothing runs or waits for a decision, and nothing will start: the batch is done,
        or stopped (its queued items wait for a resubmission), or cancelled or out of
        budget with every queued item ended."""
        if self.record.status == "running" or self.running or self.parked:
            return False
        return self.record.status == "stopped" or not self.queued

    @property
    def rate(self) -> float:
        """Items ended per second since the batch was created."""
        elapsed = (self.record.finished_at or self.at) - self.record.created_at
        return self.record.ended / elapsed if elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds until every item has ended at the current rate (None: no rate yet)."""
        left = self.record.total - self.record.ended
        return left / self.rate if self.rate > 0 else None

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "batch": r.id,
            "name": r.name,
            "status": r.status,
            "error": r.error,
            "total": r.total,
            "queued": self.queued,
            "running": self.running,
            "waiting_for_approval": self.parked,
            **r.counts,
            "usage": r.usage,
            "cost": None if r.cost_unknown else r.cost,
            "unpriced_requests": r.unpriced,
            "rate": round(self.rate, 3),
            "eta": None if self.eta is None else round(self.eta, 1),
            "created_at": r.created_at,
            "finished_at": r.finished_at or None,
        }


class Batch:
    """A submitted batch (`Client.submit_batch`, `Client.batch`)."""

    def __init__(self, client: Client, batch: str):
        self.client, self.id = client, batch

    def record(self) -> BatchRecord:
        raw = self.client.redis.hgetall(self.client.keys.batch(self.id))
        if not raw:
            raise UnknownBatch(self.id)
        return BatchRecord.from_hash(self.id, raw)

    def progress(self) -> BatchProgress:
        """Counts per status, usage and cost, rate and ETA."""
        keys, redis = self.client.keys, self.client.redis
        record = self.record()
        active = [text(t) for t in redis.hkeys(keys.batch_active(self.id))]
        with redis.pipeline(transaction=False) as pipe:
            pipe.llen(keys.batch_queue(self.id))
            for turn_id in active:
                pipe.hmget(keys.turn(turn_id), "status", "step_kind")
            queued, *states = pipe.execute()
        parked = sum(1 for s, k in states if (s, k) == (b"parked", b"execution"))
        running = sum(1 for s, _ in states if s not in (b"finished", b"failed", b"cancelled"))
        return BatchProgress(record, queued, running - parked, parked, time.time())

    def results(
        self, after: str = "0-0", *, follow: bool = False
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """The items' results in completion order, after the cursor `after` (a results
        stream id), each with its cursor (resume from the last one seen). With `follow`,
        waits for more until the batch has ended."""
        key = self.client.keys.batch_results(self.id)
        self.record()
        while True:
            reply = self.client.redis.xread({key: after}, count=500, block=1000 if follow else None)
            entries = reply[0][1] if reply else []
            for entry_id, fields in entries:
                after = text(entry_id)
                yield after, result_line(fields)
            if not entries and (not follow or self._ended(after)):
                return

    def _ended(self, cursor: str) -> bool:
        """Whether the batch has ended and every result up to now was read."""
        return self.progress().finished and self.all_read(cursor)

    def all_read(self, cursor: str) -> bool:
        """Whether `cursor` (from `results`) is the newest result so far."""
        last = self.client.redis.xrevrange(self.client.keys.batch_results(self.id), count=1)
        return not last or text(last[0][0]) == cursor

    def wait(self, timeout: float | None = None, poll: float = 0.5) -> BatchProgress:
        """Block until every item has ended (or the batch stopped); TimeoutError after
        `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (progress := self.progress()).finished:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {self.id} did not end within {timeout} s")
            self.pump()
            time.sleep(poll)
        return progress

    def pump(self) -> None:
        """Run the batch's transition now (nodes also do, when items end and each beat)."""
        client = self.client
        pumped = batches.pump(client.keys, client.settings, self.id).run(client.redis)
        for member in pumped.started:
            client._send_step(StepRef.decode(member))
        for session_id in pumped.cancel:
            client.cancel(session_id)

    def cancel(self) -> None:
        """Stop the batch: no item starts, queued items end `cancelled`, running and parked
        items are cancelled."""
        client = self.client
        self.record()
        client.redis.hset(client.keys.batch(self.id), "status", "cancelled")
        for turn_id in client.redis.hkeys(client.keys.batch_active(self.id)):
            session = client.redis.hget(client.keys.turn(text(turn_id)), "session_id")
            if session:
                client.cancel(text(session))
        self.pump()

    async def aprogress(self) -> BatchProgress:
        return await asyncio.to_thread(self.progress)

    async def aresults(
        self, after: str = "0-0", *, follow: bool = False
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """`results` for asyncio code."""
        iterator = self.results(after, follow=follow)
        while (item := await asyncio.to_thread(next, iterator, None)) is not None:
            yield item

    async def await_(self, timeout: float | None = None) -> BatchProgress:
        """`wait` for asyncio code."""
        return await asyncio.to_thread(self.wait, timeout)

    async def acancel(self) -> None:
        await asyncio.to_thread(self.cancel)


def submit(
    client: Client,
    source: str | Path | Iterable[Mapping[str, Any]],
    options: BatchOptions,
    name: str | None = None,
) -> Batch:
    """Check every item, then write the batch in chunks and start what its concurrency
    allows. Submitting again under the same name adds only the items not yet in it."""
    items, where = _source(source)
    name = name or (batches.default_name(where) if isinstance(source, (str, Path)) else None)
    if not name:
        raise BatchFileError("give the batch a name (items from code have no file to name it)")
    batch = batches.batch_id(name)
    resolver = batches.ItemResolver(where, options)
    batches.check_file_items(items(), resolver)
    client.ping()
    record = {
        "id": batch,
        "name": name,
        "model": options.model,
        "concurrency": options.concurrency,
        "item_timeout": options.item_timeout,
        "max_cost": options.max_cost,
        "max_tokens": options.max_tokens,
        "source": str(where),
    }
    chunk: list[tuple[str, bytes]] = []
    for item in items():
        chunk.append((item.custom_id, _payload(client, batch, resolver, item)))
        if len(chunk) >= CHUNK:
            batches.add_items(client.keys, batch, record, chunk).run(client.redis)
            chunk = []
    if chunk:
        batches.add_items(client.keys, batch, record, chunk).run(client.redis)
    handle = Batch(client, batch)
    handle.pump()
    return handle


def _source(source: str | Path | Iterable[Mapping[str, Any]]) -> tuple[Any, Path]:
    """A way to read the items again (a file is read twice: checked, then written) and
    where they come from (for errors, and replay files next to a batch file)."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        return (lambda: batches.read_items(path)), path
    rows = list(source)
    where = Path("items")

    def parse() -> Iterator[BatchItem]:
        for n, row in enumerate(rows, 1):
            try:
                line = json.dumps(dict(row))
            except (TypeError, ValueError) as exc:
                raise BatchFileError(f"item {n}: not JSON data ({exc})") from None
            yield batches.parse_item(where, n, line)

    return parse, where


def _payload(client: Client, batch: str, resolver: batches.ItemResolver, item: BatchItem) -> bytes:
    options = resolver.options
    session_id, turn_id = batches.item_ids(batch, item)
    model = resolver.model(item)
    agent_options = dict(options.agent_options)
    if item.max_turns or options.max_turns:
        agent_options["max_turns"] = item.max_turns or options.max_turns
    if options.retries is not None:
        agent_options["retries"] = options.retries
    agent_options["approval"] = resolver.policy(item)
    turn = TurnRecord(
        session_id=session_id,
        agent_id="main",
        turn_id=turn_id,
        prompt=item.prompt,
        model=model,
        replay=resolver.replay(model) if model.startswith("replay:") else "",
        options=agent_options,
        created_at=time.time(),
        max_subagents=agent_options.get("max_subagents", TurnRecord.max_subagents),
        priority=options.priority,
        batch=batch,
    )
    started = TurnStarted(
        session_id=session_id,
        turn_id=turn_id,
        corr_id=turn_id,
        prompt=item.prompt,
        model=model,
    )
    payload = transitions.turn_payload(client.settings, turn, started)
    return batches.item_payload(payload, item)
