"""The Python SDK: submit turns, follow a session's events, wait for a turn's result.

Light on purpose: redis-py and msgpack at import; Celery only when a turn is sent.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from actfleet.broker import transitions
from actfleet.broker.approvals import DecisionRefused, refusal
from actfleet.broker.batches import BatchOptions, BatchRecord
from actfleet.broker.connection import async_redis, sync_redis
from actfleet.broker.events import TERMINAL, Event, TurnStarted, Unreadable
from actfleet.broker.ids import check_id
from actfleet.broker.keys import Keys
from actfleet.broker.model_names import check_model_name
from actfleet.broker.policy import Policy, load_policy
from actfleet.broker.records import (
    ENDED,
    ApprovalRecord,
    BadRecord,
    StepRef,
    TurnRecord,
    usage_report,
)
from actfleet.broker.replay import load_replay
from actfleet.broker.settings import Settings
from actfleet.broker.stream import aread_events, read_events
from actfleet.broker.transitions import route, text

if TYPE_CHECKING:
    from actfleet.client.batch import Batch
    from actfleet.client.export import ExportResult

AGENT_OPTIONS = {
    "execution_timeout": float,
    "approval_timeout": float,
    "max_turns": int,
    "max_subagents": int,
    "max_cost": float,
    "max_tokens": int,
}
"""Options a submission may set for its agent, with their types. `max_cost` (USD) and
`max_tokens` are the turn's budgets: once reached, no model step starts and the turn ends
as finished with reason `budget`."""


class RedisUnavailable(ConnectionError):
    """Redis did not answer at the configured URL."""


class UnknownSession(LookupError):
    """No session of that id in this Redis; the message says how to find the right one."""

    def __init__(self, session_id: str):
        super().__init__(
            f"no session {session_id!r} in this Redis: check the id (run and submit print it; "
            "actfleet sessions lists recent ones) and ACTFLEET_REDIS_URL; a finished "
            "session's keys expire ACTFLEET_RETENTION seconds after its last turn"
        )
        self.session_id = session_id


STREAM_ID = re.compile(r"[0-9]+-[0-9]+")
"""A Redis stream id (`ms-n`), as events carry it in `id`."""
SEQ = re.compile(r"[0-9]+")
"""An event's `seq` number."""


@dataclass(frozen=True)
class Handle:
    """A submitted turn."""

    session_id: str
    turn_id: str


@dataclass(frozen=True)
class TurnResult:
    """How a turn ended."""

    session_id: str
    turn_id: str
    status: str
    """finished, failed or cancelled."""
    response: str = ""
    reason: str = ""
    error: str = ""
    """Why it failed; for a turn ended by its budget, which budget."""
    usage: dict[str, int | float | None] = field(default_factory=dict)
    """input_tokens, output_tokens, requests, cost (USD; None: unknown), unpriced (steps
    whose price is unknown), subagents included."""
    attempts: int = 1
    """1 + the model requests retried after transient errors."""
    error_kind: str = ""
    """For a failed turn: transient (retries ran out) or permanent."""


class Client:
    """A connection to an actfleet deployment through its Redis."""

    def __init__(self, redis_url: str | None = None):
        self.settings = Settings.from_env()
        if redis_url:
            self.settings = dataclasses.replace(self.settings, redis_url=redis_url)
        self.keys = Keys(self.settings.key_prefix)
        try:
            self.redis = sync_redis(self.settings)
        except ValueError as exc:
            raise ValueError(
                f"bad Redis URL {_safe_url(self.settings.redis_url)!r} ({exc}); write "
                "redis://[:PASSWORD@]HOST:PORT/DB in ACTFLEET_REDIS_URL (or --redis-url)"
            ) from None
        self._celery: Any = None

    def ping(self) -> None:
        """Raise RedisUnavailable, saying what to do, unless Redis answers (at once: this
        check does not wait out an outage as other commands do)."""
        try:
            probe = redis.Redis.from_url(self.settings.redis_url, socket_connect_timeout=3)
            try:
                probe.ping()
            finally:
                probe.close()
        except redis.AuthenticationError as exc:
            raise RedisUnavailable(
                f"Redis at {_safe_url(self.settings.redis_url)} refused the credentials ({exc});"
                " give its password in the URL: redis://:PASSWORD@host:port/db"
            ) from None
        except redis.RedisError as exc:
            raise RedisUnavailable(
                f"cannot reach Redis at {_safe_url(self.settings.redis_url)} ({exc}); start "
                "redis-server there or point ACTFLEET_REDIS_URL (or --redis-url) at one"
            ) from None

    def submit(
        self,
        prompt: str,
        *,
        model: str,
        session_id: str | None = None,
        approval: str | Policy = "ask",
        network: str | None = None,
        tools: list[str] | tuple[str, ...] = (),
        priority: int = 0,
        **agent_options: Any,
    ) -> Handle:
        """Enqueue one turn of the session's main agent (a new session unless `session_id`).
        `approval` is `auto`, `ask` (the default), a rules file's path or a `Policy`.
        `network="none"` cuts a new session's kernels (its subagents' too) off the network,
        whatever the nodes allow. `tools` names MCP servers configured on the nodes whose
        tools this turn's agents may use (each turn names its own; none by default). When
        agents wait for a node with room, a higher `priority` is admitted first. Everything
        is checked before anything is written."""
        if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > 100:
            raise ValueError(f"priority={priority!r}: give an integer from -100 to 100")
        if not prompt.strip():
            raise ValueError("the prompt is empty; say what the agent should do")
        if network not in (None, "none"):
            raise ValueError(
                f"network={network!r}: a submission can only narrow its kernels' network to "
                "'none' (the nodes' ACTFLEET_KERNEL_NETWORK sets the widest)"
            )
        if session_id is not None:
            check_id(session_id, "session id")
        check_model_name(model)
        policy = approval if isinstance(approval, Policy) else load_policy(approval)
        replay = ""
        if model.startswith("replay:"):
            replay, _ = load_replay(Path(model.removeprefix("replay:")))
        options = _check_options(agent_options) | {"approval": policy.to_data()}
        self.ping()
        if tools:
            options["tools"] = self._check_tools(tools)
        session_id = session_id or f"s-{uuid.uuid4().hex[:12]}"
        turn_id = f"t-{uuid.uuid4().hex[:12]}"
        now = time.time()
        started = TurnStarted(
            session_id=session_id,
            turn_id=turn_id,
            corr_id=turn_id,
            prompt=prompt,
            model=model,
            ts=now,
        )
        turn = TurnRecord(
            session_id=session_id,
            agent_id="main",
            turn_id=turn_id,
            prompt=prompt,
            model=model,
            replay=replay,
            options=options,
            created_at=now,
            max_subagents=options.get("max_subagents", TurnRecord.max_subagents),
            priority=priority,
        )
        call = transitions.submit(self.keys, self.settings, turn, started, network or "")
        state = call.run(self.redis)
        if state == "network":
            raise ValueError(
                f"session {session_id} keeps the kernel network its first turn gave it; "
                "start a new session to run with network='none'"
            )
        if state == "started":
            self._send_step(StepRef.first(session_id, "main", turn_id))
        return Handle(session_id, turn_id)

    def mcp_servers(self) -> list[str]:
        """The MCP server names the registered nodes have configured (ACTFLEET_MCP_CONFIG),
        as they published them at start."""
        published = self.redis.hgetall(self.keys.mcp_servers())
        registered = {text(n) for n in self.redis.smembers(self.keys.nodes())}
        names: set[str] = set()
        for node, raw in published.items():
            if text(node) not in registered:
                continue
            try:
                listed = json.loads(raw)
            except ValueError:
                continue
            if isinstance(listed, list):
                names.update(n for n in listed if isinstance(n, str))
        return sorted(names)

    def _check_tools(self, tools: list[str] | tuple[str, ...]) -> list[str]:
        """The named MCP servers, each configured on some node; ValueError naming the
        unknown ones and the configured ones."""
        if isinstance(tools, str) or not all(isinstance(t, str) and t for t in tools):
            raise ValueError(f"tools={tools!r}: give a list of MCP server names")
        configured = self.mcp_servers()
        unknown = [t for t in tools if t not in configured]
        if unknown:
            have = ", ".join(configured) if configured else "none (no running node has any)"
            raise ValueError(
                f"unknown MCP server{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                f"the nodes have configured: {have} (ACTFLEET_MCP_CONFIG on the workers)"
            )
        return list(dict.fromkeys(tools))

    def submit_batch(
        self,
        items: str | Path | Iterable[Mapping[str, Any]],
        *,
        model: str,
        name: str | None = None,
        concurrency: int = 32,
        approval: str = "auto",
        max_turns: int | None = None,
        retries: int | None = None,
        item_timeout: float = 0.0,
        max_cost: float = 0.0,
        max_tokens: int = 0,
        item_max_cost: float | None = None,
        item_max_tokens: int | None = None,
        priority: int = 0,
        tools: list[str] | tuple[str, ...] = (),
        **agent_options: Any,
    ) -> Batch:
        """Submit a batch: `items` is a JSONL file (one item per line: `custom_id`,
        `prompt`, optionally `model`, `approval`, `max_turns`, `session_id`, `metadata`) or
        the items as mappings. Every item is checked before anything is written
        (BatchFileError naming the line and field). The same name (default: the file's
        stem) is the same batch: submitting again adds only the missing items. At most
        `concurrency` items run at once; `max_cost` (USD) and `max_tokens` budget the whole
        batch, `item_max_cost` and `item_max_tokens` each item (it ends `budget`);
        `item_timeout` (seconds, 0 none) cancels an item running longer; `tools` names the
        MCP servers its items' agents may use."""
        item_budgets = {"max_cost": item_max_cost, "max_tokens": item_max_tokens}
        agent_options |= {k: v for k, v in item_budgets.items() if v is not None}
        from actfleet.client import batch

        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency}: give at least 1")
        if min(item_timeout, max_cost, max_tokens) < 0:
            raise ValueError("item_timeout, max_cost and max_tokens cannot be negative")
        options = BatchOptions(
            model=model,
            concurrency=concurrency,
            approval=approval,
            max_turns=max_turns,
            retries=retries,
            item_timeout=item_timeout,
            max_cost=max_cost,
            max_tokens=max_tokens,
            priority=priority,
            agent_options=_check_options(agent_options)
            | ({"tools": self._check_tools(tools)} if tools else {}),
        )
        return batch.submit(self, items, options, name)

    def batch(self, batch_id: str) -> Batch:
        """A submitted batch by id (`b-<name>`); UnknownBatch when there is none."""
        from actfleet.client.batch import Batch

        handle = Batch(self, check_id(batch_id, "batch id"))
        handle.record()
        return handle

    def batches(self, limit: int = 20) -> list[BatchRecord]:
        """The most recently created batches, newest first."""
        ids = [text(b) for b in self.redis.zrevrange(self.keys.batches(), 0, limit - 1)]
        with self.redis.pipeline(transaction=False) as pipe:
            for batch_id in ids:
                pipe.hgetall(self.keys.batch(batch_id))
            raws = pipe.execute()
        return [BatchRecord.from_hash(b, raw) for b, raw in zip(ids, raws, strict=True) if raw]

    def _send_step(self, ref: StepRef) -> None:
        """Send a step a transition made current (recorded in the dispatch set first, so a
        send lost now is made again by a node)."""
        from actfleet.broker.celery_app import make_celery, send_step

        if self._celery is None:
            self._celery = make_celery(self.settings)
        queue = route(self.keys, self.redis.get(self.keys.lease(ref.session_id, ref.agent_id)))
        send_step(self._celery, ref, queue)

    def events(
        self, session_id: str, after: str | int | None = None, *, follow: bool = True
    ) -> Iterator[Event]:
        """The session's events after `after`: a stream id (an event's `id`), or a `seq`
        number (an int or digits), or None for all; with `follow`, waits for new ones until
        the caller stops iterating. ValueError for anything else."""
        check_id(session_id, "session id")
        cursor, after_seq = _cursor(after)
        events = read_events(self.redis, self.keys, session_id, cursor, follow=follow)
        return events if after_seq is None else _after_seq(events, after_seq)

    async def aevents(
        self, session_id: str, after: str | int | None = None, *, follow: bool = True
    ) -> AsyncIterator[Event]:
        """`events` for asyncio code."""
        check_id(session_id, "session id")
        cursor, after_seq = _cursor(after)
        conn = async_redis(self.settings)
        try:
            async for event in aread_events(conn, self.keys, session_id, cursor, follow=follow):
                if after_seq is not None:
                    if event.seq <= after_seq and not isinstance(event, Unreadable):
                        continue
                    after_seq = None
                yield event
        finally:
            await conn.aclose()

    def session_exists(self, session_id: str) -> bool:
        """Whether the session was submitted to this Redis (and has not expired)."""
        check_id(session_id, "session id")
        return bool(self.redis.exists(self.keys.session(session_id)))

    def sessions(self, limit: int = 20) -> list[tuple[str, float]]:
        """The most recently active sessions, newest first: (session id, last activity)."""
        newest = self.redis.zrevrange(self.keys.sessions(), 0, limit - 1, withscores=True)
        return [(text(sid), float(score)) for sid, score in newest]

    def live_nodes(self) -> list[str]:
        """The names of the worker nodes whose heartbeat is current."""
        names = sorted(text(n) for n in self.redis.smembers(self.keys.nodes()))
        if not names:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.exists(self.keys.node(name))
            alive = pipe.execute()
        return [name for name, up in zip(names, alive, strict=True) if up]

    def last_event_id(self, session_id: str) -> str:
        """The newest stream id of the session ("0-0" when it has none yet)."""
        last = self.redis.xrevrange(self.keys.stream(session_id), count=1)
        return text(last[0][0]) if last else "0-0"

    def result(self, turn_id: str) -> TurnResult | None:
        """How the turn ended, or None while it runs or waits."""
        raw = self.redis.hgetall(self.keys.turn(turn_id))
        if not raw:
            return None
        turn = TurnRecord.from_hash({**raw, b"turn_id": turn_id}, turn_id)
        if turn.status not in ENDED:
            return None
        return TurnResult(
            session_id=turn.session_id,
            turn_id=turn_id,
            status=turn.status,
            response=turn.response,
            reason=turn.reason,
            error=turn.error,
            usage=usage_report(turn.usage()),
            attempts=turn.attempts,
            error_kind=turn.error_kind,
        )

    def session_usage(self, session_id: str) -> dict[str, int | float | None]:
        """The usage of the session's ended turns (main agent's, subagents included), as
        `TurnResult.usage` gives a turn's."""
        check_id(session_id, "session id")
        raw = self.redis.hgetall(self.keys.session(session_id))
        fields = {text(k): text(v) for k, v in raw.items()}
        names = ("input_tokens", "output_tokens", "requests", "unpriced")
        usage: dict[str, int | float] = {k: int(fields.get(k) or 0) for k in names}
        usage["cost"] = float(fields.get("cost") or 0.0)
        return usage_report(usage)

    def wait(self, handle: Handle, timeout: float | None = None) -> TurnResult:
        """Block until the turn ends; TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = self.last_event_id(handle.session_id)
        while True:
            result = self.result(handle.turn_id)
            if result is not None:
                return result
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"turn {handle.turn_id} did not end within {timeout} s")
            block = 1000 if remaining is None else max(1, min(1000, int(remaining * 1000)))
            reply = self.redis.xread({self.keys.stream(handle.session_id): cursor}, block=block)
            if reply:
                cursor = text(reply[0][1][-1][0])

    def pending(
        self,
        session_id: str | None = None,
        *,
        batch: str | None = None,
        on_unreadable: Callable[[str, str], None] | None = None,
    ) -> list[ApprovalRecord]:
        """Requests waiting for a decision, oldest first (all sessions, one, or the items
        of one batch). A request whose record cannot be read is skipped (`on_unreadable(id,
        why)` is told)."""
        if session_id is not None:
            check_id(session_id, "session id")
        ids = [text(i) for i in self.redis.zrange(self.keys.approvals(session_id or ""), 0, -1)]
        with self.redis.pipeline(transaction=False) as pipe:
            for request_id in ids:
                pipe.hgetall(self.keys.approval(request_id))
            raws = pipe.execute()
        records = []
        for request_id, raw in zip(ids, raws, strict=True):
            try:
                records.append(ApprovalRecord.from_hash(raw, request_id))
            except BadRecord as exc:
                if on_unreadable is not None:
                    on_unreadable(request_id, str(exc))
        records = [r for r in records if r.status == "pending"]
        if batch is not None:
            with self.redis.pipeline(transaction=False) as pipe:
                for record in records:
                    pipe.hget(self.keys.turn(record.turn_id), "batch")
                batches = [text(b or b"") for b in pipe.execute()]
            records = [r for r, b in zip(records, batches, strict=True) if b == batch]
        return records

    def request(self, request_id: str) -> ApprovalRecord:
        """One request, pending or decided; DecisionRefused when there is no such id or its
        record cannot be read."""
        check_id(request_id, "request id")
        raw = self.redis.hgetall(self.keys.approval(request_id))
        if not raw:
            raise refusal("unknown", request_id, "", "")
        try:
            return ApprovalRecord.from_hash(raw, request_id)
        except BadRecord as exc:
            raise DecisionRefused(f"{exc}; it cannot be decided") from None

    def approve(
        self, request_id: str, *, args_sha256: str, approver: str | None = None, reason: str = ""
    ) -> ApprovalRecord:
        """Approve the request made for exactly these arguments; DecisionRefused otherwise.
        `reason` is recorded with the decision (e.g. the pattern that approved it)."""
        return self._decide(request_id, "approved", args_sha256, approver, reason)

    def reject(
        self, request_id: str, *, args_sha256: str, reason: str = "", approver: str | None = None
    ) -> ApprovalRecord:
        """Reject the request (the turn ends; the model is told why)."""
        return self._decide(request_id, "rejected", args_sha256, approver, reason)

    def _decide(
        self, request_id: str, status: str, sha: str, approver: str | None, reason: str
    ) -> ApprovalRecord:
        record = self.request(request_id)
        decision = transitions.decide(
            self.keys,
            self.settings,
            record,
            status=status,  # type: ignore[arg-type]
            args_sha=sha,
            approver=approver or getpass.getuser(),
            reason=reason,
            decision_id=uuid.uuid4().hex,
        ).run(self.redis)
        if decision.verdict == "hash":
            raise refusal("hash", request_id, decision.detail, "")
        if decision.verdict in ("unknown", "decided"):
            raise refusal(decision.verdict, request_id, decision.status, decision.detail)
        if decision.resume is not None:
            # The fleet resends this step if we die now (the dispatch set): nothing is lost.
            self._send_step(decision.resume)
        decided = self.request(request_id)
        if decision.status == "expired":
            raise DecisionRefused(
                f"request {request_id} had expired ({decided.reason}); the turn goes on as rejected"
            )
        return decided

    def cancel(self, session_id: str) -> None:
        """Cancel everything the session runs, wherever it runs: model streams stop, cells
        are interrupted, pending approvals are withdrawn, subagents end. Each agent reports
        one Cancelled event; the session accepts new turns afterwards. UnknownSession (and
        nothing written) when this Redis has no such session."""
        self.ping()
        if not self.session_exists(session_id):
            raise UnknownSession(session_id)
        for ref in transitions.cancel(self.keys, self.settings, session_id).run(self.redis):
            self._send_step(ref)

    def dead_letters(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest messages nodes could not read or run, each with its source, reason,
        size, a preview and its time (`ts`); an entry that is itself unreadable says so."""
        entries = []
        for raw in self.redis.lrange(self.keys.dead_letters(), 0, limit - 1):
            try:
                entry = json.loads(raw)
                if not isinstance(entry, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                entry = {"source": "?", "reason": f"unreadable dead letter: {exc}", "ts": 0}
            entries.append(entry)
        return entries

    def export(
        self, session_id: str, directory: str | Path | None = None, *, force: bool = False
    ) -> ExportResult:
        """Write the session out as freeact stores sessions: `<agent_id>.jsonl` per agent
        (one `{"v": 1, "message", "meta": {"ts"}}` line per model message) and
        `events.jsonl`, into `directory` (default `./<session_id>`). Existing files are
        refused (ExportError, nothing written) unless `force`."""
        from actfleet.client.export import read_session, write_session

        check_id(session_id, "session id")
        snapshot = read_session(self.redis, self.keys, session_id)
        return write_session(snapshot, Path(directory or session_id), force=force)

    def output(self, ref: str) -> str:
        """The full output of a truncated cell (`CodeExecutionOutput.output_ref`)."""
        data = self.redis.get(self.keys.output(ref))
        if data is None:
            raise KeyError(f"no stored output {ref!r} (expired or never truncated)")
        return text(data)

    def close(self) -> None:
        self.redis.close()


def is_terminal_for(event: Event, turn_id: str) -> bool:
    """Whether the event ends the given turn."""
    return isinstance(event, TERMINAL) and event.turn_id == turn_id


def _cursor(after: str | int | None) -> tuple[str | None, int | None]:
    """A stream cursor and a seq to skip through, from what `events` was given."""
    if after is None:
        return None, None
    if isinstance(after, int) and not isinstance(after, bool) and after >= 0:
        return None, after
    if isinstance(after, str) and SEQ.fullmatch(after):
        return None, int(after)
    if isinstance(after, str) and STREAM_ID.fullmatch(after):
        return after, None
    raise ValueError(
        f"{after!r} is neither a stream id (like 1712345678901-0: an event's id, which "
        "watch --json prints) nor a seq number (like 20: the events after that seq)"
    )


def _after_seq(events: Iterator[Event], seq: int) -> Iterator[Event]:
    """The events after the one numbered `seq` (an unreadable entry ends the skipping)."""
    for event in events:
        if event.seq > seq or isinstance(event, Unreadable):
            yield event
            yield from events
            return


def _check_options(options: dict[str, Any]) -> dict[str, Any]:
    for name, value in options.items():
        kind = AGENT_OPTIONS.get(name)
        if kind is None:
            raise ValueError(f"unknown agent option {name!r}; known: {', '.join(AGENT_OPTIONS)}")
        if not isinstance(value, (kind, int)) or isinstance(value, bool):
            raise ValueError(f"agent option {name!r} must be a {kind.__name__}, got {value!r}")
    return options


def _safe_url(url: str) -> str:
    """The URL without its password."""
    if "@" not in url:
        return url
    scheme, _, rest = url.rpartition("://")
    return f"{scheme}://***@{rest.split('@', 1)[1]}" if scheme else f"***@{url.split('@')[-1]}"
