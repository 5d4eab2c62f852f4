"""Writing a session out the way freeact stores sessions, so it outlives Redis's retention.

freeact keeps `<sessions>/<session_id>/<agent_id>.jsonl`: one line per model message,
`{"v": 1, "message": <ModelMessage as JSON>, "meta": {"ts": <UTC ISO time>}}`. The history
in Redis already holds each message as pydantic-ai JSON, so lines are built from that JSON
without pydantic-ai (the CLI stays light). The session's events go to `events.jsonl`, one
per line as `actfleet watch --json` prints them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from actfleet.broker.events import Event
from actfleet.broker.ids import BadId, check_id
from actfleet.broker.keys import Keys
from actfleet.broker.stream import entries_to_events
from actfleet.broker.transitions import text
from actfleet.client.render import json_line

ENVELOPE_VERSION = 1
"""The `v` of freeact's session lines."""
EVENTS_FILE = "events.jsonl"


class ExportError(ValueError):
    """The session cannot be exported as asked; the message says why and what to do."""


@dataclass(frozen=True)
class SessionSnapshot:
    """A session as one consistent read of Redis: every agent's history and the stream."""

    session_id: str
    histories: dict[str, list[bytes]]
    """Agent id to its model messages (pydantic-ai JSON), oldest first."""
    events: list[Event]


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote."""

    messages: dict[Path, int]
    """Each agent's file written, with the number of its messages."""
    events_file: Path
    events: int
    first_seq: int
    """The `seq` of the first event written: above 1 when the stream was trimmed (0: none)."""
    agents_without_messages: list[str]
    """Agents of the session with no stored history (not started yet, or expired)."""


def read_session(conn: redis.Redis, keys: Keys, session_id: str) -> SessionSnapshot:
    """Every history of the session and its stream, read in one transaction so a running
    session's files and events agree; ExportError naming the session when Redis has none."""
    agents_key = keys.session_agents(session_id)
    with conn.pipeline() as pipe:
        while True:
            try:
                pipe.watch(agents_key)
                agents = sorted(text(a) for a in pipe.smembers(agents_key))
                pipe.multi()
                for agent in agents:
                    pipe.lrange(keys.history(session_id, agent), 0, -1)
                pipe.xrange(keys.stream(session_id))
                *histories, entries = pipe.execute()
                break
            except redis.WatchError:
                continue
    if not agents and not entries:
        raise ExportError(
            f"no session {session_id!r} in this Redis: check the id (submit and run print it) "
            "and ACTFLEET_REDIS_URL; a session's keys expire ACTFLEET_RETENTION seconds after "
            "its last turn ended"
        )
    for agent in agents:
        try:
            check_id(agent, "agent id")
        except BadId as exc:
            raise ExportError(f"session {session_id!r} lists a bad agent: {exc}") from None
    return SessionSnapshot(
        session_id=session_id,
        histories=dict(zip(agents, histories, strict=True)),
        events=entries_to_events(session_id, entries),
    )


def write_session(snapshot: SessionSnapshot, directory: Path, *, force: bool) -> ExportResult:
    """Write one `<agent_id>.jsonl` per agent with messages, and `events.jsonl`. Files that
    exist are left alone unless `force`; nothing is written when one would be refused."""
    written_at = _iso_utc(datetime.now(UTC))
    agent_files = {
        f"{agent}.jsonl": [
            _envelope(snapshot.session_id, agent, index, item, written_at)
            for index, item in enumerate(history)
        ]
        for agent, history in snapshot.histories.items()
        if history
    }
    files = agent_files | {EVENTS_FILE: [json_line(event) for event in snapshot.events]}
    existing = sorted(name for name in files if (directory / name).exists())
    if existing and not force:
        raise ExportError(
            f"{directory} already has {', '.join(existing)}: export to another directory "
            "(-o DIR) or pass --force to overwrite them"
        )
    directory.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        _replace(directory / name, lines)
    return ExportResult(
        messages={directory / name: len(lines) for name, lines in agent_files.items()},
        events_file=directory / EVENTS_FILE,
        events=len(snapshot.events),
        first_seq=snapshot.events[0].seq if snapshot.events else 0,
        agents_without_messages=[a for a, h in snapshot.histories.items() if not h],
    )


def _message_ts(message: dict[str, Any]) -> datetime | None:
    """When the message was made: its own `timestamp` (a model response's), else the latest
    of its parts' (a request is complete when its last part is), None when it has none."""
    own = message.get("timestamp")
    candidates = (
        [own]
        if own is not None
        else [part.get("timestamp") for part in message["parts"] if isinstance(part, dict)]
    )
    stamps = [_parse_iso(c) for c in candidates if isinstance(c, str)]
    known = [stamp for stamp in stamps if stamp is not None]
    return max(known) if known else None


def _envelope(session_id: str, agent: str, index: int, item: bytes, written_at: str) -> str:
    """One freeact session line for a stored message; `written_at` when it carries no time
    (freeact's own `ts` is when the line was written)."""
    try:
        message = json.loads(item)
    except ValueError as exc:
        raise ExportError(
            f"message {index} of {agent} in session {session_id!r} is not JSON ({exc})"
        ) from None
    if not isinstance(message, dict) or not isinstance(message.get("parts"), list):
        raise ExportError(
            f"message {index} of {agent} in session {session_id!r} is not a model message"
        )
    made = _message_ts(message)
    ts = written_at if made is None else _iso_utc(made)
    return json.dumps({"v": ENVELOPE_VERSION, "message": message, "meta": {"ts": ts}})


def _parse_iso(value: str) -> datetime | None:
    """A timestamp as an aware datetime (naive ones are taken as UTC), None if unreadable."""
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


def _iso_utc(stamp: datetime) -> str:
    """The UTC ISO form freeact writes (`...Z`)."""
    return stamp.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _replace(path: Path, lines: list[str]) -> None:
    """Write the file whole or not at all: a failed export never leaves a half file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    os.replace(partial, path)
