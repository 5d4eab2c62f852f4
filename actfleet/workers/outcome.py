"""The one place a step's outcome is committed and its next steps are sent.

A step returns what it did (`Advance`, `Park` or `End`, see broker/transitions.py); `apply`
commits it atomically and then sends whatever the commit made current: the turn's next
step, the agent's next queued turn, a parent resumed by its last child. Subagents waiting
for a slot are started when a parent parks for them and when a child ends.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
)

from actfleet.broker import transitions
from actfleet.broker.records import StepRef, TurnRecord
from actfleet.broker.transitions import End, Outcome, Park
from actfleet.workers import batch_items
from actfleet.workers.context import NodeContext
from actfleet.workers.models import dump_message, load_message

log = logging.getLogger("actfleet.steps")


async def apply(ctx: NodeContext, turn: TurnRecord, ref: StepRef, outcome: Outcome) -> None:
    """Commit the step's outcome, then send the steps it made current."""
    if isinstance(outcome, End) and not outcome.history and outcome.status != "finished":
        note = f"[actfleet] Not run: the turn was {outcome.status}."
        outcome = dataclasses.replace(outcome, history=await _close_open_calls(ctx, turn, note))
    committed = await transitions.commit(
        ctx.keys,
        ctx.settings,
        ctx.name,
        turn,
        ref,
        outcome,
        drop_results=_obsolete_results(ref, outcome),
    ).arun(ctx.redis)
    if committed.state == "stale":
        log.warning("step %s not committed: its turn had already ended", ref.encode())
        return
    for sent in committed.sends:
        if (sent.session_id, sent.agent_id) == (ref.session_id, ref.agent_id):
            ctx.publish(sent, ctx.queue)  # the agent's runtime is here
        else:
            await ctx.send([sent])
    if isinstance(outcome, Park) and outcome.next == "collect":
        await start_children(ctx, turn.session_id, turn.agent_id, turn.max_subagents)
    if isinstance(outcome, End) and turn.is_subagent:
        await start_children(ctx, turn.session_id, turn.parent_agent, turn.max_subagents)
    if turn.batch and not turn.is_subagent and batch_items.frees_a_slot(outcome):
        await batch_items.pump(ctx, turn.batch)


def _obsolete_results(ref: StepRef, outcome: Outcome) -> StepRef | None:
    """The execution step whose per-call results this commit makes obsolete: its own
    (unless it parks for subagents, who write theirs there), or, for a collect step, the
    execution step whose subagents it collected."""
    if ref.kind == "execution" and not isinstance(outcome, Park):
        return ref
    if ref.kind == "collect":
        return dataclasses.replace(ref, step_no=ref.step_no - 1, kind="execution")
    return None


async def start_children(ctx: NodeContext, session_id: str, parent_agent: str, cap: int) -> None:
    """Start the parent's waiting children that the caps allow."""
    started = await transitions.pump(ctx.keys, ctx.settings, session_id, parent_agent, cap).arun(
        ctx.redis
    )
    await ctx.send(started)


async def _close_open_calls(ctx: NodeContext, turn: TurnRecord, note: str) -> list[bytes]:
    """Tool results for the calls of a last model response that never got one, so the
    history stays valid for the agent's next turn."""
    last = await ctx.redis.lindex(ctx.keys.history(turn.session_id, turn.agent_id), -1)
    if last is None:
        return []
    message = load_message(last)
    calls = tool_calls(message)
    if not isinstance(message, ModelResponse) or not calls:
        return []
    returns = [
        ToolReturnPart(tool_name=c.tool_name, content=note, tool_call_id=c.tool_call_id)
        for c in calls
    ]
    return [dump_message(ModelRequest(parts=returns))]


def tool_calls(message: ModelMessage | Any) -> list[ToolCallPart]:
    return [p for p in getattr(message, "parts", []) if isinstance(p, ToolCallPart)]


async def history_of(ctx: NodeContext, runtime: Any) -> list[ModelMessage]:
    """The agent's whole message history. Parsed messages are kept in the runtime and only
    new ones are read: every step of the agent runs here, under the runtime's lock."""
    key = ctx.keys.history(runtime.session_id, runtime.agent_id)
    new = await ctx.redis.lrange(key, len(runtime.history), -1)
    runtime.history.extend(load_message(item) for item in new)
    return list(runtime.history)
