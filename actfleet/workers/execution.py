"""The execution step: the tool calls of one model response, in order. Code runs in the
agent's kernel (each shell command under the policy); `subagent_task` calls spawn child
agents, and the turn then parks until they report (a collect step follows). A call that
was running when its node died is reported as interrupted, never run twice."""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

from pydantic_ai.messages import ModelRequest, ToolCallPart, ToolReturnPart

from actfleet.broker.approvals import ApprovalRecord, dispatch_member
from actfleet.broker.celery_app import MODEL_STEP
from actfleet.broker.events import (
    CodeExecutionOutput,
    CodeExecutionOutputChunk,
    Event,
    ToolOutput,
)
from actfleet.broker.state import text
from actfleet.broker.subagents import spawn
from actfleet.workers.approvals import ShellGate, action_of, policy_of, refused_event
from actfleet.workers.models import CODE_TOOL, SUBAGENT_TOOL, dump_message
from actfleet.workers.turn import (
    DEFAULT_MAX_SUBAGENTS,
    Turn,
    coalescer,
    commit,
    finish,
    history_of,
    start_children,
)

if TYPE_CHECKING:
    from actfleet.workers.node import Node
    from actfleet.workers.runtimes import Runtime

LOST = (
    "[actfleet] Interrupted: the node running this execution died while it ran, and the "
    "kernel's state was lost. It was not re-run; it may or may not have had effects."
)
NOT_RUN = "[actfleet] Not run: the kernel was lost before this call started."
NOT_RUN_REJECTED = "[actfleet] Not run: another action of this response was rejected."
NESTED = "[actfleet] subagent_task is not available to subagents: subagents cannot nest."


async def execution_step(
    node: Node, runtime: Runtime, turn: Turn, sid: str, step_no: int, previous_owner: str
) -> None:
    history = await history_of(node, runtime)
    calls = [p for p in history[-1].parts if isinstance(p, ToolCallPart)]
    events: list[Event] = []
    refused = await _refusals(node, turn, calls, events)
    results_key = node.keys.step_results(sid)
    recorded = {text(k): text(v) for k, v in (await node.redis.hgetall(results_key)).items()}
    gate = ShellGate(node, policy_of(turn.options), {}, turn.approval_timeout)
    returns: list[ToolReturnPart] = []
    children = 0
    rejected = bool(refused)
    for call in calls:
        env = turn.envelope(node.name, call.tool_call_id)
        done = recorded.get(call.tool_call_id)
        if rejected:
            text_ = refused.get(call.tool_call_id, NOT_RUN_REJECTED)
            outcome = {"status": "rejected", "text": text_}
        elif call.tool_name == SUBAGENT_TOOL and not turn.is_subagent:
            if done is None:
                await _spawn(node, turn, call, sid, step_no)
            children += 1
            continue
        elif done is not None and done != "started":
            outcome = json.loads(done)
        elif done == "started" or previous_owner:
            outcome = {"status": "lost", "text": LOST if done == "started" else NOT_RUN}
        else:
            await node.redis.hset(results_key, call.tool_call_id, "started")
            gate.envelope = env
            outcome = await _run_call(node, runtime, turn, call, env, gate)
            if gate.refusals:
                refusals = "; ".join(gate.refusals)
                outcome["text"] += f"\n[actfleet] Rejected: {refusals}. The turn ended."
                outcome["rejected"] = True
            await node.redis.hset(results_key, call.tool_call_id, json.dumps(outcome))
        rejected = rejected or outcome.get("rejected", False)
        if runtime.notice and outcome["status"] not in ("unknown_tool", "rejected"):
            outcome["text"] = f"{runtime.notice}\n{outcome['text']}"
            runtime.notice = ""
            await node.redis.hset(results_key, call.tool_call_id, json.dumps(outcome))
        returns.append(
            ToolReturnPart(
                tool_name=call.tool_name, content=outcome["text"], tool_call_id=call.tool_call_id
            )
        )
        events.append(output_event(call, env, outcome))
    rounds = int(turn.fields.get("rounds", 0)) + 1
    if rejected:
        await finish(
            node,
            turn,
            sid,
            status="finished",
            reason="rejected",
            history=[dump_message(ModelRequest(parts=returns))],
            events=events,
        )
        await node.redis.delete(results_key)
        return
    if children:
        # The results stay in results_key, where each child writes its own; the collect step
        # hands them all to the model once the last child has reported.
        fields = {
            "step_no": step_no + 1,
            "step_kind": "collect",
            "rounds": rounds,
            "status": "parked",
            "waiting": children,
        }
        await commit(
            node,
            turn,
            sid,
            history=[],
            events=events,
            fields=fields,
            terminal=False,
        )
        await start_children(node, turn.session_id, turn.agent_id, _cap(turn))
        return
    committed, _, _ = await commit(
        node,
        turn,
        sid,
        history=[dump_message(ModelRequest(parts=returns))],
        events=events,
        fields={"step_no": step_no + 1, "step_kind": "model", "rounds": rounds},
        terminal=False,
    )
    if committed:
        await node.redis.delete(results_key)
        node.send(
            MODEL_STEP, [turn.session_id, turn.agent_id, turn.turn_id, step_no + 1], node.queue
        )


def _cap(turn: Turn) -> int:
    return int(turn.options.get("max_subagents", DEFAULT_MAX_SUBAGENTS))


async def _spawn(node: Node, turn: Turn, call: ToolCallPart, sid: str, step_no: int) -> None:
    """Record a child agent for a subagent_task call; it starts when a slot is free."""
    args = call.args_as_dict()
    digest = hashlib.sha256(f"{turn.turn_id}/{call.tool_call_id}".encode()).hexdigest()
    child_agent, child_turn = f"sub-{digest[:8]}", f"t-{digest[8:20]}"
    options = {k: v for k, v in turn.options.items() if k != "max_subagents"}
    options["max_turns"] = int(args.get("max_turns", 100))
    collect = dispatch_member(turn.session_id, turn.agent_id, turn.turn_id, step_no + 1, "collect")
    prompt = str(args.get("prompt", ""))
    await spawn(
        node.redis,
        node.keys,
        session_id=turn.session_id,
        parent_agent=turn.agent_id,
        child_agent=child_agent,
        child_turn=child_turn,
        cap=_cap(turn),
        prompt=prompt,
        call_id=call.tool_call_id,
        node=node.name,
        fields={
            "session_id": turn.session_id,
            "agent_id": child_agent,
            "prompt": prompt,
            "model": turn.fields["model"],
            "replay": turn.fields.get("replay", ""),
            "options": json.dumps(options),
            "created_at": time.time(),
            "parent_turn": turn.turn_id,
            "parent_agent": turn.agent_id,
            "parent_call": call.tool_call_id,
            "parent_corr_id": call.tool_call_id,
            "parent_results": node.keys.step_results(sid),
            "parent_dispatch": collect,
            "max_subagents": _cap(turn),
        },
    )


def output_event(call: ToolCallPart, env: dict[str, Any], outcome: dict[str, Any]) -> Event:
    if call.tool_name == CODE_TOOL:
        return CodeExecutionOutput(
            **env,
            text=outcome["text"],
            images=outcome.get("images", []),
            truncated=outcome.get("truncated", False),
            output_ref=outcome.get("output_ref", ""),
            status=outcome["status"],
        )
    return ToolOutput(**env, tool_name=call.tool_name, content=outcome["text"])


async def _refusals(
    node: Node, turn: Turn, calls: list[ToolCallPart], events: list[Event]
) -> dict[str, str]:
    """The model-facing result of each refused call (denied by a rule, rejected, expired);
    empty when every call may run. Requests still pending beside a refusal are withdrawn."""
    decisions = json.loads(turn.fields.get("decisions") or "{}")
    refused: dict[str, str] = {}
    pending: list[ApprovalRecord] = []
    for call in calls:
        decision = decisions.get(call.tool_call_id, {})
        if decision.get("verdict") == "deny":
            _, subject = action_of(call.tool_name, call.args_as_dict())
            env = turn.envelope(node.name, call.tool_call_id)
            events.append(refused_event(env, subject, decision["rule"]))
            refused[call.tool_call_id] = (
                f"[actfleet] Rejected: denied by rule {decision['rule']}. Nothing of this "
                "response ran; the turn ended."
            )
        elif decision.get("request"):
            record = await node.approvals.record(decision["request"])
            if record.status == "pending":
                pending.append(record)
            elif record.status != "approved":
                why = record.reason or "no reason given"
                refused[call.tool_call_id] = (
                    f"[actfleet] Rejected ({record.status}) by {record.approver}: {why}. "
                    "Nothing of this response ran; the turn ended."
                )
    if refused:
        for record in pending:
            await node.approvals.close_request(
                record, "withdrawn", "another action of the same response was rejected"
            )
    return refused


async def _run_call(
    node: Node,
    runtime: Runtime,
    turn: Turn,
    call: ToolCallPart,
    env: dict[str, Any],
    gate: ShellGate,
) -> dict[str, Any]:
    """Run one tool call; the outcome is plain data so it can be recorded in Redis."""
    if call.tool_name == SUBAGENT_TOOL:
        return {"status": "error", "text": NESTED}
    if call.tool_name != CODE_TOOL:
        return {
            "status": "unknown_tool",
            "text": f"Unknown tool {call.tool_name!r}; the only tool is {CODE_TOOL}.",
        }
    code = call.args_as_dict().get("code")
    if not isinstance(code, str):
        return {"status": "error", "text": f"{CODE_TOOL} needs a string argument 'code'."}
    chunks = coalescer(node)
    kernel = await node.runtimes.kernel(runtime)
    result = await kernel.execute(
        code,
        timeout=turn.options.get("execution_timeout", node.settings.execution_timeout),
        on_shell=gate,
        on_output=lambda t: chunks.add(CodeExecutionOutputChunk(**env, text=t), t),
    )
    await chunks.flush()
    outcome: dict[str, Any] = {
        "status": result.status,
        "text": result.text,
        "truncated": result.truncated,
    }
    ttl = node.settings.output_ttl
    if result.truncated and result.full_text is not None:
        ref = f"{runtime.session_id}:{env['turn_id']}:{runtime.agent_id}:{call.tool_call_id}"
        await node.redis.set(node.keys.output(ref), result.full_text, ex=ttl)
        outcome["output_ref"] = ref
    images = []
    for png in result.images:
        ref = hashlib.sha256(png).hexdigest()
        await node.redis.set(node.keys.image(ref), png, ex=ttl)
        images.append(ref)
    outcome["images"] = images
    return outcome
