"""A turn's bounded steps. A model step is one streamed model request; an execution step
runs the tool calls of one model response. Each step runs once per step id, and its
effects (history, events, the turn's progress) are committed atomically with "done";
the next step is enqueued after the commit, on this node's queue (affinity)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass
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

from actfleet.broker.approvals import ApprovalRecord, dispatch_member
from actfleet.broker.celery_app import EXECUTION_STEP, MODEL_STEP
from actfleet.broker.events import (
    CodeAction,
    CodeExecutionOutput,
    CodeExecutionOutputChunk,
    Event,
    Response,
    ResponseChunk,
    Thoughts,
    ThoughtsChunk,
    ToolCall,
    ToolOutput,
    TurnFailed,
    TurnFinished,
    Usage,
)
from actfleet.broker.keys import SHARED_QUEUE
from actfleet.broker.state import claim_step, commit_step, step_id, text
from actfleet.broker.stream import ChunkCoalescer
from actfleet.workers.approvals import (
    ShellGate,
    action_of,
    loads_options,
    policy_of,
    refused_event,
    request_event,
)
from actfleet.workers.models import (
    CODE_TOOL,
    ModelCallError,
    ModelConfigError,
    code_tool_definition,
    dump_message,
    load_message,
    resolve_model,
    stream_response,
    system_prompt,
)

if TYPE_CHECKING:
    from actfleet.workers.node import Node
    from actfleet.workers.runtimes import Runtime

log = logging.getLogger("actfleet.steps")

LOST = (
    "[actfleet] Interrupted: the node running this execution died while it ran, and the "
    "kernel's state was lost. It was not re-run; it may or may not have had effects."
)
NOT_RUN = "[actfleet] Not run: the kernel was lost before this call started."
FULL_BACKOFF = 0.5
"""Seconds a full node waits before handing a new agent's step back to the shared queue."""
NOT_RUN_REJECTED = "[actfleet] Not run: another action of this response was rejected."


@dataclass(frozen=True)
class Turn:
    """The turn record a step works on."""

    session_id: str
    agent_id: str
    turn_id: str
    fields: dict[str, str]

    @property
    def options(self) -> dict[str, Any]:
        return loads_options(self.fields.get("options", ""))

    @property
    def approval_timeout(self) -> float | None:
        return self.options.get("approval_timeout")

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


async def run_step(
    node: Node, kind: str, session_id: str, agent_id: str, turn_id: str, step_no: int
) -> None:
    """Run one step on this node, or send it where it belongs."""
    args = [session_id, agent_id, turn_id, step_no]
    task = MODEL_STEP if kind == "model" else EXECUTION_STEP
    runtime = await node.runtimes.obtain(session_id, agent_id)
    if runtime is None:
        log.info("node full; %s goes back to the shared queue", turn_id)
        await asyncio.sleep(FULL_BACKOFF)
        node.send(task, args, SHARED_QUEUE)
        return
    if isinstance(runtime, str):
        node.send(task, args, runtime)
        return
    sid = step_id(turn_id, step_no, kind)
    async with runtime.lock:
        member = dispatch_member(session_id, agent_id, turn_id, step_no, kind)
        verdict, previous_owner = await claim_step(
            node.redis, node.keys, sid, node.name, node.boot, member
        )
        if verdict != "ok":
            return
        turn = Turn(session_id, agent_id, turn_id, {})
        try:
            raw = await node.redis.hgetall(node.keys.turn(turn_id))
            turn = Turn(session_id, agent_id, turn_id, {text(k): text(v) for k, v in raw.items()})
            if kind == "model":
                await _model_step(node, runtime, turn, sid, step_no)
            else:
                await _execution_step(node, runtime, turn, sid, step_no, previous_owner)
        except (ModelCallError, ModelConfigError) as exc:
            # One line, secrets stripped; the provider's raw message stays out of the logs.
            log.warning("step %s: %s", sid, exc)
            await _fail(node, turn, sid, str(exc))
        except Exception as exc:
            log.exception("step %s failed", sid)
            await _fail(node, turn, sid, f"{type(exc).__name__}: {exc}")


async def _history(node: Node, runtime: Runtime) -> list[Any]:
    items = await node.redis.lrange(node.keys.history(runtime.session_id, runtime.agent_id), 0, -1)
    return [load_message(item) for item in items]


async def _model_step(node: Node, runtime: Runtime, turn: Turn, sid: str, step_no: int) -> None:
    history = await _history(node, runtime)
    added: list[Any] = []
    if step_no == 1:
        parts: list[Any] = []
        if not history:
            parts.append(SystemPromptPart(content=system_prompt(str(runtime.workdir))))
        parts.append(UserPromptPart(content=turn.fields["prompt"]))
        added.append(ModelRequest(parts=parts))
    corr = f"{turn.turn_id}:{step_no}"
    env = turn.envelope(node.name, corr)
    chunks = _coalescer(node)
    model = resolve_model(
        turn.fields["model"],
        turn.fields.get("replay") or None,
        "sub" if turn.agent_id != "main" else "main",
    )
    response: ModelResponse = await stream_response(
        model,
        history + added,
        [code_tool_definition()],
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
    decisions, requests = _apply_policy(node, turn, calls, step_no + 1)
    events.extend(
        request_event(r, node.name, turn.fields.get("parent_corr_id", "")) for r in requests
    )
    step_usage = {
        "input_tokens": response.usage.input_tokens,
        "output_tokens": response.usage.output_tokens,
        "requests": 1,
    }
    events.append(Usage(**env, **step_usage))
    totals = {k: v + step_usage[k] for k, v in turn.usage().items()}
    fields: dict[str, Any] = dict(totals)
    if calls:
        fields |= {
            "step_no": step_no + 1,
            "step_kind": "execution",
            "decisions": json.dumps(decisions),
        }
        if requests:
            # Parked: no step is sent; the last decision resumes the turn (DECIDE_LUA).
            fields |= {"status": "parked", "waiting": len(requests)}
    else:
        events.append(
            TurnFinished(
                **turn.envelope(node.name, turn.turn_id),
                reason="completed",
                response=answer,
                usage=totals,
            )
        )
        fields |= {
            "status": "finished",
            "reason": "completed",
            "response": answer,
            "finished_at": time.time(),
        }
    committed, next_turn = await commit_step(
        node.redis,
        node.keys,
        node.settings.stream_maxlen,
        sid=sid,
        session_id=turn.session_id,
        agent_id=turn.agent_id,
        turn_id=turn.turn_id,
        history=[dump_message(m) for m in added],
        events=events,
        turn_fields=fields,
        terminal=not calls,
        requests=[r.to_json() for r in requests],
    )
    if not committed:
        return
    if calls and not requests:
        node.send(
            EXECUTION_STEP, [turn.session_id, turn.agent_id, turn.turn_id, step_no + 1], node.queue
        )
    elif next_turn:
        node.send(MODEL_STEP, [turn.session_id, turn.agent_id, next_turn, 1], node.queue)


async def _execution_step(
    node: Node, runtime: Runtime, turn: Turn, sid: str, step_no: int, previous_owner: str
) -> None:
    history = await _history(node, runtime)
    calls = [p for p in history[-1].parts if isinstance(p, ToolCallPart)]
    events: list[Event] = []
    refused = await _refusals(node, turn, calls, events)
    results_key = node.keys.step_results(sid)
    recorded = {text(k): text(v) for k, v in (await node.redis.hgetall(results_key)).items()}
    gate = ShellGate(node, policy_of(turn.options), {}, turn.approval_timeout)
    returns: list[ToolReturnPart] = []
    rejected = bool(refused)
    for call in calls:
        env = turn.envelope(node.name, call.tool_call_id)
        done = recorded.get(call.tool_call_id)
        if rejected:
            outcome = {
                "status": "rejected",
                "text": refused.get(call.tool_call_id, NOT_RUN_REJECTED),
            }
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
        returns.append(
            ToolReturnPart(
                tool_name=call.tool_name, content=outcome["text"], tool_call_id=call.tool_call_id
            )
        )
        events.append(_output_event(call, env, outcome))
    fields: dict[str, Any] = {"step_no": step_no + 1, "step_kind": "model"}
    if rejected:
        usage = turn.usage()
        events.append(
            TurnFinished(**turn.envelope(node.name, turn.turn_id), reason="rejected", usage=usage)
        )
        fields = {"status": "finished", "reason": "rejected", "finished_at": time.time()}
    committed, next_turn = await commit_step(
        node.redis,
        node.keys,
        node.settings.stream_maxlen,
        sid=sid,
        session_id=turn.session_id,
        agent_id=turn.agent_id,
        turn_id=turn.turn_id,
        history=[dump_message(ModelRequest(parts=returns))],
        events=events,
        turn_fields=fields,
        terminal=rejected,
    )
    if not committed:
        return
    await node.redis.delete(results_key)
    if not rejected:
        node.send(
            MODEL_STEP, [turn.session_id, turn.agent_id, turn.turn_id, step_no + 1], node.queue
        )
    elif next_turn:
        node.send(MODEL_STEP, [turn.session_id, turn.agent_id, next_turn, 1], node.queue)


def _output_event(call: ToolCallPart, env: dict[str, Any], outcome: dict[str, Any]) -> Event:
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


def _apply_policy(
    node: Node, turn: Turn, calls: list[ToolCallPart], exec_step_no: int
) -> tuple[dict[str, dict[str, str]], list[ApprovalRecord]]:
    """Each call's verdict under the turn's policy, and the requests to open for those that
    need a human. A deny anywhere opens none: the turn ends rejected."""
    policy = policy_of(turn.options)
    decisions: dict[str, dict[str, str]] = {}
    requests: list[ApprovalRecord] = []
    resume = dispatch_member(
        turn.session_id, turn.agent_id, turn.turn_id, exec_step_no, "execution"
    )
    for call in calls:
        args = call.args_as_dict()
        kind, subject = action_of(call.tool_name, args, CODE_TOOL)
        verdict, rule = policy.decide(kind, subject)
        decisions[call.tool_call_id] = {"verdict": verdict, "rule": rule}
        if verdict == "ask":
            record = ApprovalRecord.new(
                session_id=turn.session_id,
                agent_id=turn.agent_id,
                turn_id=turn.turn_id,
                kind=kind,
                tool_name=call.tool_name,
                args=args,
                timeout=turn.approval_timeout,
                corr_id=call.tool_call_id,
                dispatch=resume,
            )
            decisions[call.tool_call_id]["request"] = record.id
            requests.append(record)
    if any(d["verdict"] == "deny" for d in decisions.values()):
        return decisions, []
    return decisions, requests


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
            _, subject = action_of(call.tool_name, call.args_as_dict(), CODE_TOOL)
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
    if call.tool_name != CODE_TOOL:
        return {
            "status": "unknown_tool",
            "text": f"Unknown tool {call.tool_name!r}; the only tool is {CODE_TOOL}.",
        }
    code = call.args_as_dict().get("code")
    if not isinstance(code, str):
        return {"status": "error", "text": f"{CODE_TOOL} needs a string argument 'code'."}
    chunks = _coalescer(node)
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


async def _fail(node: Node, turn: Turn, sid: str, error: str) -> None:
    """End the turn with TurnFailed (the step counts as done)."""
    event = TurnFailed(**turn.envelope(node.name, turn.turn_id), error=error, usage=turn.usage())
    _, next_turn = await commit_step(
        node.redis,
        node.keys,
        node.settings.stream_maxlen,
        sid=sid,
        session_id=turn.session_id,
        agent_id=turn.agent_id,
        turn_id=turn.turn_id,
        history=[],
        events=[event],
        turn_fields={"status": "failed", "error": error, "finished_at": time.time()},
        terminal=True,
    )
    if next_turn:
        node.send(MODEL_STEP, [turn.session_id, turn.agent_id, next_turn, 1], node.queue)


def _coalescer(node: Node) -> ChunkCoalescer:
    s = node.settings
    return ChunkCoalescer(
        node.redis, node.keys, s.stream_maxlen, s.chunk_flush_ms, s.chunk_flush_bytes
    )
