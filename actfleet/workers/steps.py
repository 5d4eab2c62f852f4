"""A turn's bounded steps. A model step is one streamed model request; an execution step
runs the tool calls of one model response (execution.py); a collect step gathers the
results of the subagents a response spawned. Each step runs once per step id, and its
effects (history, events, the turn's progress) are committed atomically with "done"; the
next step is enqueued after the commit, on this node's queue (affinity)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from actfleet.broker.approvals import dispatch_member
from actfleet.broker.celery_app import EXECUTION_STEP, MODEL_STEP, step_task
from actfleet.broker.events import (
    CodeAction,
    Event,
    Response,
    ResponseChunk,
    Thoughts,
    ThoughtsChunk,
    ToolCall,
    Usage,
)
from actfleet.broker.state import claim_step, step_id, text
from actfleet.workers.approvals import apply_policy, request_event
from actfleet.workers.execution import execution_step, output_event
from actfleet.workers.models import (
    CODE_TOOL,
    ModelCallError,
    ModelConfigError,
    code_tool_definition,
    dump_message,
    resolve_model,
    stream_response,
    subagent_tool_definition,
    system_prompt,
)
from actfleet.workers.turn import Turn, coalescer, commit, finish, history_of

if TYPE_CHECKING:
    from actfleet.workers.node import Node
    from actfleet.workers.runtimes import Runtime

log = logging.getLogger("actfleet.steps")

FULL_BACKOFF = 0.5
"""Seconds a full node waits before handing a new agent's step back to the shared queue."""
PHASES = {"model": "llm_streaming", "execution": "tool_execution", "collect": "subagents"}


async def run_step(
    node: Node, kind: str, session_id: str, agent_id: str, turn_id: str, step_no: int
) -> None:
    """Run one step on this node, or send it where it belongs."""
    args = [session_id, agent_id, turn_id, step_no]
    runtime = await node.runtimes.obtain(session_id, agent_id)
    if runtime is None:
        log.info("node full; %s goes back to the shared queue", turn_id)
        await asyncio.sleep(FULL_BACKOFF)
        node.send(step_task(kind), args, node.keys.shared_queue())
        return
    if isinstance(runtime, str):
        node.send(step_task(kind), args, runtime)
        return
    sid = step_id(turn_id, step_no, kind)
    async with runtime.lock:
        member = dispatch_member(session_id, agent_id, turn_id, step_no, kind)
        verdict, previous_owner = await claim_step(
            node.redis, node.keys, sid, node.name, node.boot, member
        )
        if verdict != "ok":
            return
        async with node.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(node.keys.turn(turn_id))
            pipe.get(node.keys.cancel(session_id))
            raw, cancelled_at = await pipe.execute()
        turn = Turn(session_id, agent_id, turn_id, {text(k): text(v) for k, v in raw.items()})
        if cancelled_at is not None and float(cancelled_at) >= float(
            turn.fields.get("created_at", 0)
        ):
            await cancel(node, turn, sid, turn.fields.get("cancel_phase") or "between_steps")
            return
        work = asyncio.ensure_future(_run(node, runtime, turn, kind, sid, step_no, previous_owner))
        node.running[work] = session_id
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            if not work.cancelled():
                raise
            await cancel(node, turn, sid, PHASES[kind])
        finally:
            node.running.pop(work, None)


async def _run(
    node: Node, runtime: Runtime, turn: Turn, kind: str, sid: str, step_no: int, previous_owner: str
) -> None:
    try:
        if kind == "model":
            await _model_step(node, runtime, turn, sid, step_no)
        elif kind == "execution":
            await execution_step(node, runtime, turn, sid, step_no, previous_owner)
        else:
            await _collect_step(node, runtime, turn, sid, step_no)
    except asyncio.CancelledError:
        raise
    except (ModelCallError, ModelConfigError) as exc:
        # One line, secrets stripped; the provider's raw message stays out of the logs.
        log.warning("step %s: %s", sid, exc)
        await finish(node, turn, sid, status="failed", error=str(exc))
    except Exception as exc:
        log.exception("step %s failed", sid)
        await finish(node, turn, sid, status="failed", error=f"{type(exc).__name__}: {exc}")


async def cancel(node: Node, turn: Turn, sid: str, phase: str) -> None:
    """End a cancelled turn: its pending requests are withdrawn, one Cancelled event."""
    await node.approvals.withdraw_turn(turn.session_id, turn.turn_id, "the session was cancelled")
    await finish(node, turn, sid, status="cancelled", phase=phase)


async def _model_step(node: Node, runtime: Runtime, turn: Turn, sid: str, step_no: int) -> None:
    history = await history_of(node, runtime)
    rounds = int(turn.fields.get("rounds", 0))
    max_turns = turn.options.get("max_turns")
    if max_turns is not None and rounds >= max_turns:
        await finish(
            node,
            turn,
            sid,
            status="finished",
            reason="max_turns",
            response=turn.fields.get("last_text", ""),
        )
        return
    added: list[Any] = []
    if step_no == 1:
        parts: list[Any] = []
        if not history:
            parts.append(SystemPromptPart(content=system_prompt(str(runtime.workdir))))
        parts.append(UserPromptPart(content=turn.fields["prompt"]))
        added.append(ModelRequest(parts=parts))
    env = turn.envelope(node.name, f"{turn.turn_id}:{step_no}")
    chunks = coalescer(node)
    model = resolve_model(
        turn.fields["model"],
        turn.fields.get("replay") or None,
        "sub" if turn.is_subagent else "main",
    )
    tools = [code_tool_definition()]
    if not turn.is_subagent:
        tools.append(subagent_tool_definition())
    response: ModelResponse = await stream_response(
        model,
        history + added,
        tools,
        on_thinking=lambda t: chunks.add(ThoughtsChunk(**env, content=t), t),
        on_text=lambda t: chunks.add(ResponseChunk(**env, content=t), t),
        timeout=node.settings.model_timeout,
    )
    await chunks.flush()
    added.append(response)

    events: list[Event] = []
    thoughts = "".join(p.content for p in response.parts if isinstance(p, ThinkingPart))
    answer = "".join(p.content for p in response.parts if isinstance(p, TextPart))
    if thoughts:
        events.append(Thoughts(**env, content=thoughts))
    if answer:
        events.append(Response(**env, content=answer))
    calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
    for call in calls:
        call_env = turn.envelope(node.name, call.tool_call_id)
        if call.tool_name == CODE_TOOL:
            events.append(CodeAction(**call_env, code=str(call.args_as_dict().get("code", ""))))
        else:
            events.append(ToolCall(**call_env, tool_name=call.tool_name, args=call.args_as_dict()))
    decisions, requests = apply_policy(turn, calls, step_no + 1)
    parent_corr = turn.fields.get("parent_corr_id", "")
    events.extend(request_event(r, node.name, parent_corr) for r in requests)
    step_usage = {
        "input_tokens": response.usage.input_tokens,
        "output_tokens": response.usage.output_tokens,
        "requests": 1,
    }
    events.append(Usage(**env, **step_usage))
    totals = {k: v + step_usage[k] for k, v in turn.usage().items()}
    history_items = [dump_message(m) for m in added]
    if not calls:
        await finish(
            node,
            turn,
            sid,
            status="finished",
            reason="completed",
            response=answer,
            history=history_items,
            events=events,
            usage=totals,
        )
        return
    fields: dict[str, Any] = {
        **totals,
        "step_no": step_no + 1,
        "step_kind": "execution",
        "decisions": json.dumps(decisions),
        "last_text": answer,
    }
    if requests:
        # Parked: no step is sent; the last decision resumes the turn (DECIDE_LUA).
        fields |= {"status": "parked", "waiting": len(requests)}
    committed, _, _ = await commit(
        node,
        turn,
        sid,
        history=history_items,
        events=events,
        fields=fields,
        terminal=False,
        requests=[r.to_json() for r in requests],
    )
    if committed and not requests:
        node.send(
            EXECUTION_STEP, [turn.session_id, turn.agent_id, turn.turn_id, step_no + 1], node.queue
        )


async def _collect_step(node: Node, runtime: Runtime, turn: Turn, sid: str, step_no: int) -> None:
    """All subagents of the previous execution step have reported: hand every call's result
    to the model in the order of the calls."""
    history = await history_of(node, runtime)
    calls = [p for p in history[-1].parts if isinstance(p, ToolCallPart)]
    results_key = node.keys.step_results(step_id(turn.turn_id, step_no - 1, "execution"))
    recorded = {
        text(k): json.loads(v)
        for k, v in (await node.redis.hgetall(results_key)).items()
        if v != b"started"
    }
    returns, events = [], []
    for call in calls:
        outcome = recorded.get(call.tool_call_id) or {
            "status": "lost",
            "text": "[actfleet] No result was recorded for this call.",
        }
        returns.append(
            ToolReturnPart(
                tool_name=call.tool_name, content=outcome["text"], tool_call_id=call.tool_call_id
            )
        )
        if call.tool_name != CODE_TOOL:
            events.append(output_event(call, turn.envelope(node.name, call.tool_call_id), outcome))
    committed, _, _ = await commit(
        node,
        turn,
        sid,
        history=[dump_message(ModelRequest(parts=returns))],
        events=events,
        fields={"step_no": step_no + 1, "step_kind": "model"},
        terminal=False,
    )
    if committed:
        await node.redis.delete(results_key)
        node.send(
            MODEL_STEP, [turn.session_id, turn.agent_id, turn.turn_id, step_no + 1], node.queue
        )
