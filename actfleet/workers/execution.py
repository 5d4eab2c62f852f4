"""The execution step: the tool calls of one model response, in order. Code runs in the
agent's kernel (each shell command under the policy); `subagent_task` calls spawn child
agents, and the turn then parks until they report (a collect step follows). A call that
was running when its node died is reported as interrupted, never run twice."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic_ai.messages import ModelRequest, ToolCallPart, ToolReturnPart

from actfleet.broker import transitions
from actfleet.broker.events import (
    CodeExecutionOutput,
    CodeExecutionOutputChunk,
    Event,
    SubagentStarted,
    ToolOutput,
)
from actfleet.broker.records import ApprovalRecord, BadRecord, StepRef, TurnRecord
from actfleet.broker.transitions import Advance, End, Outcome, Park, Progress, text
from actfleet.workers.approvals import Approvals, ShellGate, action_of, policy_of, refused_event
from actfleet.workers.context import NodeContext
from actfleet.workers.kernel import Kernel, KernelStartError
from actfleet.workers.models import CODE_TOOL, RESET_TOOL, SUBAGENT_TOOL, dump_message, tool_names
from actfleet.workers.outcome import history_of, tool_calls
from actfleet.workers.runtimes import Runtime
from actfleet.workers.tool_calls import (
    CodeToolGate,
    is_mcp_call,
    run_json_calls,
    selected_servers,
    write_tool_modules,
)
from actfleet.workers.tool_calls import tool_names as mcp_tool_names

KernelOf = Callable[[Runtime], Awaitable[Kernel]]

LOST = (
    "[actfleet] Interrupted: the node running this execution died while it ran, and the "
    "kernel's state was lost. It was not re-run; it may or may not have had effects."
)
NOT_RUN = "[actfleet] Not run: the kernel was lost before this call started."
NOT_RUN_REJECTED = "[actfleet] Not run: another action of this response was rejected."
NESTED = "[actfleet] subagent_task is not available to subagents: subagents cannot nest."
RESET = (
    "[actfleet] The kernel was restarted: variables, imports and definitions from earlier "
    "cells are gone; files in the working directory are kept."
)


async def execution_step(
    ctx: NodeContext,
    approvals: Approvals,
    runtime: Runtime,
    kernel_of: KernelOf,
    turn: TurnRecord,
    ref: StepRef,
    previous_owner: str,
) -> Outcome:
    """Run the calls; `previous_owner` is the node that had claimed this step before (a
    dead node: its kernel is lost; this node: the kernel is intact)."""
    history = await history_of(ctx, runtime)
    calls = tool_calls(history[-1])
    events: list[Event] = []
    refused = await _refusals(ctx, approvals, turn, calls, events)
    results = ctx.keys.step_results(ref.id)
    recorded = {text(k): text(v) for k, v in (await ctx.redis.hgetall(results)).items()}
    gate = ShellGate(approvals, policy_of(turn.options), {}, turn.options.get("approval_timeout"))
    kernel_lost = previous_owner not in ("", ctx.name)
    returns: list[ToolReturnPart] = []
    children = 0
    rejected = bool(refused)
    mcp_calls = [call for call in calls if is_mcp_call(call, turn)]
    mcp_outcomes = (
        {} if rejected else await run_json_calls(ctx, runtime, turn, mcp_calls, results, recorded)
    )
    for call in calls:
        env = turn.envelope(ctx.name, call.tool_call_id)
        if rejected:
            outcome = {
                "status": "rejected",
                "text": refused.get(call.tool_call_id, NOT_RUN_REJECTED),
            }
        elif call.tool_name == SUBAGENT_TOOL and not turn.is_subagent:
            if call.tool_call_id not in recorded:
                await _spawn(ctx, turn, call, ref)
            children += 1
            continue
        elif call.tool_call_id in mcp_outcomes:
            outcome = mcp_outcomes[call.tool_call_id]
        else:
            done = recorded.get(call.tool_call_id)
            gate.envelope = env
            outcome = await _call_outcome(
                ctx, runtime, kernel_of, turn, call, ref, done, kernel_lost, gate
            )
        rejected = rejected or outcome.get("rejected", False)
        if runtime.notice and outcome["status"] not in ("unknown_tool", "rejected"):
            outcome["text"] = f"{runtime.notice}\n{outcome['text']}"
            runtime.notice = ""
            await ctx.redis.hset(results, call.tool_call_id, json.dumps(outcome))
        returns.append(
            ToolReturnPart(
                tool_name=call.tool_name, content=outcome["text"], tool_call_id=call.tool_call_id
            )
        )
        events.append(output_event(call, env, outcome))
    progress = Progress(rounds=turn.rounds + 1)
    if rejected:
        history_item = [dump_message(ModelRequest(parts=returns))]
        return End("finished", reason="rejected", history=history_item, events=events)
    if children:
        # The results stay in the step's results, where each child writes its own; the
        # collect step hands them all to the model once the last child has reported.
        return Park("collect", children, events=events, progress=progress)
    return Advance("model", [dump_message(ModelRequest(parts=returns))], events, progress)


async def _call_outcome(
    ctx: NodeContext,
    runtime: Runtime,
    kernel_of: KernelOf,
    turn: TurnRecord,
    call: ToolCallPart,
    ref: StepRef,
    done: str | None,
    kernel_lost: bool,
    gate: ShellGate,
) -> dict[str, Any]:
    """One call's outcome: recorded before, reported lost, or run now (marked started
    first, recorded after), so it runs at most once."""
    if done is not None and done != "started":
        return json.loads(done)
    if done == "started" or kernel_lost:
        return {"status": "lost", "text": LOST if done == "started" else NOT_RUN}
    results = ctx.keys.step_results(ref.id)
    await ctx.redis.hset(results, call.tool_call_id, "started")
    outcome = await _run_call(ctx, runtime, kernel_of, turn, call, gate)
    if gate.refusals:
        refusals = "; ".join(gate.refusals)
        outcome["text"] += f"\n[actfleet] Rejected: {refusals}. The turn ended."
        outcome["rejected"] = True
    await ctx.redis.hset(results, call.tool_call_id, json.dumps(outcome))
    return outcome


async def _spawn(ctx: NodeContext, turn: TurnRecord, call: ToolCallPart, ref: StepRef) -> None:
    """Record a child agent for a subagent_task call; it starts when a slot is free."""
    args = call.args_as_dict()
    digest = hashlib.sha256(f"{turn.turn_id}/{call.tool_call_id}".encode()).hexdigest()
    child_agent, child_turn = f"sub-{digest[:8]}", f"t-{digest[8:20]}"
    options = {k: v for k, v in turn.options.items() if k != "max_subagents"}
    options["max_turns"] = int(args.get("max_turns", 100))
    prompt = str(args.get("prompt", ""))
    child = TurnRecord(
        session_id=turn.session_id,
        agent_id=child_agent,
        turn_id=child_turn,
        prompt=prompt,
        model=turn.model,
        replay=turn.replay,
        options=options,
        created_at=time.time(),
        parent_turn=turn.turn_id,
        parent_agent=turn.agent_id,
        parent_call=call.tool_call_id,
        parent_step=ref.step_no,
        max_subagents=turn.max_subagents,
        batch=turn.batch,
    )
    started = SubagentStarted(
        **child.envelope(ctx.name, child_turn), subagent_id=child_agent, prompt=prompt
    )
    await transitions.spawn(ctx.keys, child, started, cap=turn.max_subagents).arun(ctx.redis)


def output_event(call: ToolCallPart, env: dict[str, Any], outcome: dict[str, Any]) -> Event:
    if call.tool_name == CODE_TOOL:
        return CodeExecutionOutput(
            **env,
            text=outcome["text"],
            images=outcome.get("images", []),
            truncated=outcome.get("truncated", False),
            output_ref=outcome.get("output_ref", ""),
            lines=outcome.get("lines", 0),
            status=outcome["status"],
        )
    return ToolOutput(
        **env,
        tool_name=call.tool_name,
        content=outcome["text"],
        truncated=outcome.get("truncated", False),
        output_ref=outcome.get("output_ref", ""),
    )


async def _refusals(
    ctx: NodeContext,
    approvals: Approvals,
    turn: TurnRecord,
    calls: list[ToolCallPart],
    events: list[Event],
) -> dict[str, str]:
    """The model-facing result of each refused call (denied by a rule, rejected, expired,
    or its request unreadable); empty when every call may run. Requests still pending
    beside a refusal are withdrawn."""
    refused: dict[str, str] = {}
    pending: list[ApprovalRecord] = []
    for call in calls:
        decision = turn.decisions.get(call.tool_call_id, {})
        if decision.get("verdict") == "deny":
            _, subject = action_of(call.tool_name, call.args_as_dict())
            env = turn.envelope(ctx.name, call.tool_call_id)
            events.append(refused_event(env, subject, decision["rule"]))
            refused[call.tool_call_id] = (
                f"[actfleet] Rejected: denied by rule {decision['rule']}. Nothing of this "
                "response ran; the turn ended."
            )
        elif decision.get("request"):
            try:
                record = await approvals.record(decision["request"])
            except BadRecord as exc:
                refused[call.tool_call_id] = f"[actfleet] Not run: {exc}. The turn ended."
                continue
            if record.status == "pending":
                pending.append(record)
            elif record.status != "approved":
                refused[call.tool_call_id] = (
                    f"[actfleet] {_refusal(record)}. Nothing of this response ran; the turn ended."
                )
    if refused:
        for record in pending:
            await approvals.close_request(
                record, "withdrawn", "another action of the same response was rejected"
            )
    return refused


async def _reset(runtime: Runtime, kernel_of: KernelOf) -> dict[str, Any]:
    """reset_kernel: the agent's kernel restarts (a fresh process, the working directory
    kept); a runtime whose kernel was never started gets a fresh one anyway."""
    started = runtime.kernel is not None
    try:
        kernel = await kernel_of(runtime)
        if started:
            await kernel.restart()
    except KernelStartError as exc:
        return {"status": "error", "text": f"[actfleet] The kernel did not restart: {exc}"}
    return {"status": "ok", "text": RESET}


def _refusal(record: ApprovalRecord) -> str:
    """Why a decided request refused its call: who rejected it and why, or how it ended
    without a human (expired, withdrawn)."""
    if record.status == "rejected":
        return f"Rejected by {record.approver}" + (f": {record.reason}" if record.reason else "")
    return f"Rejected ({record.reason or record.status})"


async def _run_call(
    ctx: NodeContext,
    runtime: Runtime,
    kernel_of: KernelOf,
    turn: TurnRecord,
    call: ToolCallPart,
    gate: ShellGate,
) -> dict[str, Any]:
    """Run one tool call; the outcome is plain data so it can be recorded in Redis."""
    if call.tool_name == SUBAGENT_TOOL:
        return {"status": "error", "text": NESTED}
    if call.tool_name == RESET_TOOL:
        return await _reset(runtime, kernel_of)
    if call.tool_name != CODE_TOOL:
        offered = [*tool_names(turn.is_subagent), *await mcp_tool_names(ctx, runtime, turn)]
        tools = ", ".join(offered)
        return {
            "status": "unknown_tool",
            "text": f"[actfleet] Unknown tool {call.tool_name!r}; the tools are: {tools}.",
        }
    code = call.args_as_dict().get("code")
    if not isinstance(code, str):
        return {"status": "error", "text": f"{CODE_TOOL} needs a string argument 'code'."}
    env = gate.envelope
    chunks = ctx.coalescer()
    kernel = await kernel_of(runtime)
    tools_error = ""
    if selected_servers(turn):
        tools_error = await write_tool_modules(ctx, runtime, turn)
    result = await kernel.execute(
        code,
        timeout=turn.options.get("execution_timeout", ctx.settings.execution_timeout),
        on_shell=gate,
        on_output=lambda t: chunks.add(CodeExecutionOutputChunk(**env, text=t), t),
        on_tool=CodeToolGate(ctx, gate, runtime, turn) if selected_servers(turn) else None,
    )
    await chunks.flush()
    if tools_error:
        result = dataclasses.replace(result, text=f"[actfleet] {tools_error}\n{result.text}")
    whole = result.full_text if result.full_text is not None else result.text
    outcome: dict[str, Any] = {
        "status": result.status,
        "text": result.text,
        "truncated": result.truncated,
        "lines": whole.count("\n") + (not whole.endswith("\n") and bool(whole)),
    }
    ttl = ctx.settings.output_ttl
    if result.truncated and result.full_text is not None:
        ref = f"{runtime.session_id}:{turn.turn_id}:{runtime.agent_id}:{call.tool_call_id}"
        await ctx.redis.set(ctx.keys.output(ref), result.full_text, ex=ttl)
        outcome["output_ref"] = ref
    for image in result.images:  # for readers away from the node's disk (the dashboard)
        await ctx.redis.set(ctx.keys.image(image.name), image.data, ex=ttl)
    outcome["images"] = [image.path for image in result.images]
    return outcome
