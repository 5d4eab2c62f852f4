"""The turn a step works on, and the one way a turn ends: a terminal event committed with
the step, then the agent's next queued turn sent, or the parent resumed and the siblings
waiting for a slot started (for a subagent)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart

from actfleet.broker.approvals import parse_dispatch_member
from actfleet.broker.celery_app import MODEL_STEP, step_task
from actfleet.broker.events import Cancelled, Event, SubagentFinished, TurnFailed, TurnFinished
from actfleet.broker.state import commit_step
from actfleet.broker.stream import ChunkCoalescer
from actfleet.broker.subagents import child_outcome, pump
from actfleet.workers.models import dump_message, load_message

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

    from actfleet.workers.node import Node
    from actfleet.workers.runtimes import Runtime

DEFAULT_MAX_SUBAGENTS = 5


@dataclass(frozen=True)
class Turn:
    """The turn record a step works on."""

    session_id: str
    agent_id: str
    turn_id: str
    fields: dict[str, str]

    @property
    def options(self) -> dict[str, Any]:
        raw = self.fields.get("options", "")
        return json.loads(raw) if raw else {}

    @property
    def approval_timeout(self) -> float | None:
        return self.options.get("approval_timeout")

    @property
    def is_subagent(self) -> bool:
        return bool(self.fields.get("parent_turn"))

    def usage(self) -> dict[str, int]:
        return {
            k: int(self.fields.get(k, 0)) for k in ("input_tokens", "output_tokens", "requests")
        }

    def envelope(self, node: str, corr_id: str = "") -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "agent_id": self.agent_id,
            "turn_id": self.turn_id,
            "corr_id": corr_id,
            "parent_corr_id": self.fields.get("parent_corr_id", ""),
            "node": node,
        }


async def finish(
    node: Node,
    turn: Turn,
    sid: str,
    *,
    status: str,
    reason: str = "",
    response: str = "",
    error: str = "",
    phase: str = "",
    history: list[bytes] = (),  # type: ignore[assignment]
    events: list[Event] = (),  # type: ignore[assignment]
    usage: dict[str, int] | None = None,
) -> None:
    """End the turn: `finished` (with `reason`), `failed` (with `error`) or `cancelled`
    (with the `phase` it was in)."""
    usage = usage or turn.usage()
    env = turn.envelope(node.name, turn.turn_id)
    if not history and status != "finished":
        history = await _close_open_calls(node, turn, f"[actfleet] Not run: the turn was {status}.")
    terminal: Event
    if status == "finished":
        terminal = TurnFinished(**env, reason=reason, response=response, usage=usage)
    elif status == "failed":
        terminal = TurnFailed(**env, error=error, usage=usage)
    else:
        terminal = Cancelled(**env, phase=phase)
    fields = {
        **usage,
        "status": status,
        "reason": reason or status,
        "response": response,
        "error": error,
        "finished_at": time.time(),
    }
    report = None
    if turn.is_subagent:
        said = (
            response
            if status == "finished" and reason == "completed"
            else (
                error
                or f"The subagent's turn ended: {reason or status}"
                + (f" ({phase})" if phase else "")
                + (f". Its last answer: {response}" if response else "")
            )
        )
        finished = SubagentFinished(
            **turn.envelope(node.name, turn.turn_id),
            subagent_id=turn.agent_id,
            status=reason or status,
            response=said,
        )
        report = (child_outcome(reason or status, said), finished)
    _, next_turn, resume = await commit(
        node,
        turn,
        sid,
        history=list(history),
        events=[*events, terminal],
        fields=fields,
        terminal=True,
        child_report=report,
    )
    if next_turn:
        node.send(MODEL_STEP, [turn.session_id, turn.agent_id, next_turn, 1], node.queue)
    if turn.is_subagent:
        if resume:
            await send_member(node, resume)
        await start_children(
            node,
            turn.session_id,
            turn.fields["parent_agent"],
            int(turn.fields.get("max_subagents", DEFAULT_MAX_SUBAGENTS)),
        )


async def commit(
    node: Node,
    turn: Turn,
    sid: str,
    *,
    history: list[bytes],
    events: list[Event],
    fields: dict[str, Any],
    terminal: bool = False,
    requests: list[str] = (),  # type: ignore[assignment]
    child_report: tuple[str, Event] | None = None,
) -> tuple[bool, str, str]:
    """`commit_step` for this turn's step on this node."""
    return await commit_step(
        node.redis,
        node.keys,
        node.settings.stream_maxlen,
        sid=sid,
        session_id=turn.session_id,
        agent_id=turn.agent_id,
        turn_id=turn.turn_id,
        history=history,
        events=events,
        turn_fields=fields,
        terminal=terminal,
        requests=requests,
        child_report=child_report,
    )


async def _close_open_calls(node: Node, turn: Turn, note: str) -> list[bytes]:
    """Tool results for the calls of a last model response that never got one, so the
    history stays valid for the agent's next turn."""
    last = await node.redis.lindex(node.keys.history(turn.session_id, turn.agent_id), -1)
    if last is None:
        return []
    message = load_message(last)
    calls = [p for p in getattr(message, "parts", []) if isinstance(p, ToolCallPart)]
    if not isinstance(message, ModelResponse) or not calls:
        return []
    returns = [
        ToolReturnPart(tool_name=c.tool_name, content=note, tool_call_id=c.tool_call_id)
        for c in calls
    ]
    return [dump_message(ModelRequest(parts=returns))]


async def start_children(node: Node, session_id: str, parent_agent: str, cap: int) -> None:
    """Start the parent's waiting children that the caps allow."""
    for member in await pump(
        node.redis,
        node.keys,
        node.settings.stream_maxlen,
        session_id=session_id,
        parent_agent=parent_agent,
        cap=cap,
        fleet_cap=node.settings.max_agents,
        ttl=node.settings.lease_ttl,
    ):
        await send_member(node, member)


async def send_member(node: Node, member: str) -> None:
    """Send the step a dispatch member names, to its agent's node or the shared queue."""
    from actfleet.broker.state import route

    session_id, agent_id, turn_id, step_no, kind = parse_dispatch_member(member)
    queue = route(node.keys, await node.redis.get(node.keys.lease(session_id, agent_id)))
    node.send(step_task(kind), [session_id, agent_id, turn_id, step_no], queue)


async def history_of(node: Node, runtime: Runtime) -> list[ModelMessage]:
    """The agent's whole message history. Parsed messages are kept in the runtime and only
    new ones are read: every step of the agent runs here, under the runtime's lock."""
    key = node.keys.history(runtime.session_id, runtime.agent_id)
    new = await node.redis.lrange(key, len(runtime.history), -1)
    runtime.history.extend(load_message(item) for item in new)
    return list(runtime.history)


def coalescer(node: Node) -> ChunkCoalescer:
    s = node.settings
    return ChunkCoalescer(
        node.redis, node.keys, s.stream_maxlen, s.chunk_flush_ms, s.chunk_flush_bytes
    )
