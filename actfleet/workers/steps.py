"""Running a step on this node: route it to its agent's runtime, claim it (the claim
refuses anything that is not its turn's current step), run it, apply its outcome.

A model step is one streamed model request; an execution step runs the tool calls of one
model response (execution.py); a collect step hands the subagents' results to the model.
Each returns an outcome; `outcome.apply` commits it and sends what comes next.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.tools import ToolDefinition
from redis.exceptions import RedisError

from actfleet.broker import transitions
from actfleet.broker.events import (
    CodeAction,
    Event,
    ModelRetry,
    Response,
    ResponseChunk,
    Thoughts,
    ThoughtsChunk,
    ToolCall,
    Usage,
)
from actfleet.broker.records import StepRef, TurnRecord
from actfleet.broker.transitions import Advance, End, Outcome, Park, Progress, text
from actfleet.workers.admission import Admission, current_priority
from actfleet.workers.approvals import Approvals, apply_policy, request_event
from actfleet.workers.budgets import budget_reached
from actfleet.workers.context import NodeContext
from actfleet.workers.execution import execution_step, output_event
from actfleet.workers.mcp_servers import McpServerError
from actfleet.workers.models import (
    CODE_TOOL,
    ModelCallError,
    ModelConfigError,
    dump_message,
    resolve_model,
    stream_response,
    system_prompt,
    tool_definitions,
)
from actfleet.workers.outcome import apply, history_of, tool_calls
from actfleet.workers.pricing import response_cost
from actfleet.workers.retries import RetryPolicy, error_kind, with_retries
from actfleet.workers.runtimes import Runtime, Runtimes
from actfleet.workers.sandbox import code_dir
from actfleet.workers.tool_calls import definitions, turn_tools

log = logging.getLogger("actfleet.steps")

PHASES = {"model": "llm_streaming", "execution": "tool_execution", "collect": "subagents"}


class Steps:
    """The steps this node runs, and how they are cancelled."""

    def __init__(
        self, ctx: NodeContext, runtimes: Runtimes, approvals: Approvals, admission: Admission
    ):
        self.ctx, self.runtimes, self.approvals = ctx, runtimes, approvals
        self.admission = admission
        self.running: dict[str, tuple[asyncio.Future[Outcome], str]] = {}
        """Encoded step -> (its work, its session), for cancellation and the heartbeat."""

    def cancel_session(self, session_id: str) -> None:
        """Stop this node's running steps of a cancelled session."""
        for work, session in list(self.running.values()):
            if session == session_id:
                work.cancel()

    async def run(self, ref: StepRef) -> None:
        """Run one step here, or send it where it belongs: to the node holding its agent,
        or, for an agent new to a full node (or arriving while others wait), to the
        waiting set (admission.py)."""
        ctx, priority = self.ctx, 0
        if not self.runtimes.holds(ref.session_id, ref.agent_id):
            priority = await current_priority(ctx, ref)
            if priority is None:
                log.warning("refused step %s: it is not its turn's current step", ref.encode())
                return
            if await self.admission.others_waiting():
                await self.admission.wait(ref, priority)
                await self.admission.admit()
                return
        runtime = await self.runtimes.obtain(ref.session_id, ref.agent_id)
        if runtime is None:
            log.info("node full; %s waits for room", ref.encode())
            await self.admission.wait(ref, priority)
            return
        if isinstance(runtime, str):
            ctx.publish(ref, runtime)
            return
        async with runtime.lock:
            claim = await transitions.claim(ctx.keys, ref, ctx.name, ctx.boot).arun(ctx.redis)
            previous = claim.detail
            if claim.verdict == "mine" and ref.encode() not in self.running:
                # Claimed here before, then cut off (a Redis error): run it again; the
                # kernel is intact, and a call that had started is reported, not re-run.
                claim = await self._reclaim(ref)
                previous = ctx.name
            if claim.verdict == "refused":
                log.warning("refused step %s: %s", ref.encode(), claim.detail)
            elif claim.verdict == "done":
                log.info("skipped step %s: it ran already (a duplicate)", ref.encode())
            elif claim.verdict == "busy":
                log.info("skipped step %s: node %s runs it", ref.encode(), claim.detail)
            if claim.turn is None or claim.verdict not in ("ok", "cancel"):
                return
            turn = claim.turn
            draft = Draft()
            if claim.verdict == "cancel":
                outcome = await self._cancelled(turn, turn.cancel_phase or "between_steps")
            else:
                outcome = await self._run_cancellable(runtime, turn, ref, previous, draft)
            if ref.kind == "model" and isinstance(outcome, End) and outcome.status != "finished":
                outcome = await keep_unanswered(ctx, runtime, turn, ref, draft, outcome)
            await apply(ctx, turn, ref, outcome)
        if isinstance(outcome, End):
            await self.admission.admit()  # the agent's runtime may be evicted now

    async def _reclaim(self, ref: StepRef) -> transitions.Claim:
        ctx = self.ctx
        raw = await ctx.redis.hgetall(ctx.keys.turn(ref.turn_id))
        turn = TurnRecord.from_hash({**raw, b"turn_id": ref.turn_id}, ref.turn_id)
        if turn.current != ref or turn.status != "running":
            return transitions.Claim("refused", f"the turn is {turn.status}", None)
        return transitions.Claim("ok", ctx.name, turn)

    async def _run_cancellable(
        self, runtime: Runtime, turn: TurnRecord, ref: StepRef, previous: str, draft: Draft
    ) -> Outcome:
        work = asyncio.ensure_future(self._run(runtime, turn, ref, previous, draft))
        self.running[ref.encode()] = (work, ref.session_id)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if not work.cancelled():
                raise
            return await self._cancelled(turn, PHASES[ref.kind])
        finally:
            self.running.pop(ref.encode(), None)

    async def _run(
        self, runtime: Runtime, turn: TurnRecord, ref: StepRef, previous: str, draft: Draft
    ) -> Outcome:
        try:
            if ref.kind == "model":
                return await model_step(self.ctx, runtime, turn, ref, draft)
            if ref.kind == "execution":
                kernel = self.runtimes.kernel
                return await execution_step(
                    self.ctx, self.approvals, runtime, kernel, turn, ref, previous
                )
            return await collect_step(self.ctx, runtime, turn, ref)
        except ModelCallError as exc:
            # One line, secrets stripped; the provider's raw message stays out of the logs.
            log.warning("step %s: %s", ref.id, exc)
            return End("failed", error=str(exc), error_kind=error_kind(exc))
        except ModelConfigError as exc:
            log.warning("step %s: %s", ref.id, exc)
            return End("failed", error=str(exc), error_kind="permanent")
        except (asyncio.CancelledError, RedisError):
            raise  # a Redis outage leaves the step to be sent again, not failed
        except Exception as exc:
            log.exception("step %s failed", ref.id)
            return End("failed", error=f"{type(exc).__name__}: {exc}", error_kind="permanent")

    async def _cancelled(self, turn: TurnRecord, phase: str) -> End:
        """A cancelled turn's end: its pending requests are withdrawn."""
        reason = "the session was cancelled"
        await self.approvals.withdraw_turn(turn.session_id, turn.turn_id, reason)
        return End("cancelled", phase=phase)


@dataclass
class Draft:
    """What a model step has that the agent's history keeps when the turn ends before the
    step completes (cancelled, failed): the turn's opening request and the answer text
    streamed so far, as freeact keeps them, so the next turn's model sees what was asked."""

    request: ModelRequest | None = None
    text: list[str] = field(default_factory=list)
    retries: int = 0
    """Model requests of this step retried after a transient error (counted in the turn's
    attempts however the step ends)."""


async def model_step(
    ctx: NodeContext, runtime: Runtime, turn: TurnRecord, ref: StepRef, draft: Draft
) -> Outcome:
    history = await history_of(ctx, runtime)
    max_turns = turn.options.get("max_turns")
    if max_turns is not None and turn.rounds >= max_turns:
        return End("finished", reason="max_turns", response=turn.last_text)
    spent = await budget_reached(ctx, turn)
    if spent is not None:
        log.info("turn %s: %s", turn.turn_id, spent)
        return End("finished", reason="budget", response=turn.last_text, error=spent)
    try:
        mcp_tools = await turn_tools(ctx, runtime, turn)
    except McpServerError as exc:
        return End("failed", error=str(exc))
    added: list[Any] = []
    if ref.step_no == 1:
        draft.request = opening_request(ctx, runtime, turn, history)
        added.append(draft.request)
    tools = [*tool_definitions(turn.is_subagent), *definitions(mcp_tools)]
    response = await _stream(ctx, turn, ref, history + added, tools, draft)
    added.append(response)
    events, answer = _response_events(ctx, turn, ref, response)
    calls = tool_calls(response)
    mcp_names = [tool.full_name for tool in mcp_tools]
    decisions, requests = apply_policy(turn, calls, ref.next("execution"), mcp_names)
    events.extend(request_event(r, ctx.name, turn.parent_call) for r in requests)
    cost = response_cost(response, turn.model)
    tokens = {
        "input_tokens": response.usage.input_tokens,
        "output_tokens": response.usage.output_tokens,
    }
    env = turn.envelope(ctx.name, f"{turn.turn_id}:{ref.step_no}")
    events.append(Usage(**env, **tokens, requests=1, cost=cost))
    step_usage = {**tokens, "requests": 1, "cost": cost or 0.0, "unpriced": int(cost is None)}
    totals = {k: v + step_usage[k] for k, v in turn.usage().items()}
    attempts = turn.attempts + draft.retries
    history_items = [dump_message(m) for m in added]
    if not calls:
        return End(
            "finished",
            reason="completed",
            response=answer,
            history=history_items,
            events=events,
            usage=totals,
            attempts=attempts,
        )
    progress = Progress(usage=totals, decisions=decisions, last_text=answer, attempts=attempts)
    if requests:
        # Parked: the last decision resumes the turn (lua/decide.lua).
        return Park("execution", len(requests), history_items, events, requests, progress)
    return Advance("execution", history_items, events, progress)


def opening_request(
    ctx: NodeContext, runtime: Runtime, turn: TurnRecord, history: list[Any]
) -> ModelRequest:
    """A turn's first request: its prompt, after the system prompt if the agent has no
    history yet."""
    parts: list[Any] = []
    if not history:
        where = code_dir(runtime.workdir, ctx.settings.sandbox)
        parts.append(SystemPromptPart(content=system_prompt(str(where))))
    parts.append(UserPromptPart(content=turn.prompt))
    return ModelRequest(parts=parts)


async def keep_unanswered(
    ctx: NodeContext, runtime: Runtime, turn: TurnRecord, ref: StepRef, draft: Draft, end: End
) -> End:
    """A turn that ends in a model step (cancelled, failed) keeps its prompt and the
    partial answer in the agent's history (and the partial answer as a Response event);
    its attempts count the step's retries."""
    end = dataclasses.replace(end, attempts=turn.attempts + draft.retries)
    messages: list[Any] = []
    if ref.step_no == 1:
        messages.append(
            draft.request or opening_request(ctx, runtime, turn, await history_of(ctx, runtime))
        )
    partial = "".join(draft.text)
    events = list(end.events)
    if partial:
        messages.append(ModelResponse(parts=[TextPart(content=partial)], model_name=turn.model))
        env = turn.envelope(ctx.name, f"{turn.turn_id}:{ref.step_no}")
        events.append(Response(**env, content=partial))
    if not messages:
        return end
    history = [*end.history, *(dump_message(m) for m in messages)]
    return dataclasses.replace(end, history=history, events=events)


async def _stream(
    ctx: NodeContext,
    turn: TurnRecord,
    ref: StepRef,
    messages: list[Any],
    tools: list[ToolDefinition],
    draft: Draft,
) -> ModelResponse:
    """One streamed model response; thinking and text chunks go to the stream as they come,
    and the text to the draft. A transient failure is retried (workers/retries.py), each
    retry announced by a ModelRetry event.

    A request that fails after it streamed chunks is retried too (nothing of a response
    acts before it is complete, so a retry is safe): the chunks already written stay in the
    stream, the ModelRetry event says they were `discarded`, and the draft keeps only the
    retry's text. Readers show answers from the complete Response event, not the chunks."""
    env = turn.envelope(ctx.name, f"{turn.turn_id}:{ref.step_no}")
    chunks = ctx.coalescer()
    model = resolve_model(turn.model, turn.replay or None, "sub" if turn.is_subagent else "main")
    policy = RetryPolicy.from_settings(ctx.settings)
    if isinstance(retries := turn.options.get("retries"), int):  # a batch's --retries
        policy = dataclasses.replace(policy, retries=max(retries, 0))
    streamed = False

    def on_thinking(piece: str) -> None:
        nonlocal streamed
        streamed = True
        chunks.add(ThoughtsChunk(**env, content=piece), piece)

    def on_text(piece: str) -> None:
        nonlocal streamed
        streamed = True
        draft.text.append(piece)
        chunks.add(ResponseChunk(**env, content=piece), piece)

    async def attempt() -> ModelResponse:
        return await stream_response(
            model,
            messages,
            tools,
            on_thinking=on_thinking,
            on_text=on_text,
            timeout=ctx.settings.model_timeout,
        )

    async def on_retry(failed: int, delay: float, error: ModelCallError) -> None:
        nonlocal streamed
        await chunks.flush()
        retry = ModelRetry(
            **env,
            attempt=failed,
            max_attempts=1 + policy.retries,
            delay=round(delay, 3),
            error=str(error),
            discarded=streamed,
        )
        streamed = False
        draft.text.clear()
        draft.retries += 1
        log.info("step %s: retry %d in %.2f s: %s", ref.id, failed, delay, error)
        await ctx.emit([retry])

    response = await with_retries(attempt, policy, on_retry)
    await chunks.flush()
    return response


def _response_events(
    ctx: NodeContext, turn: TurnRecord, ref: StepRef, response: ModelResponse
) -> tuple[list[Event], str]:
    """The events of a model response (thoughts, answer, each call), and its answer."""
    env = turn.envelope(ctx.name, f"{turn.turn_id}:{ref.step_no}")
    events: list[Event] = []
    thoughts = "".join(p.content for p in response.parts if isinstance(p, ThinkingPart))
    answer = "".join(p.content for p in response.parts if isinstance(p, TextPart))
    if thoughts:
        events.append(Thoughts(**env, content=thoughts))
    if answer:
        events.append(Response(**env, content=answer))
    for call in tool_calls(response):
        call_env = turn.envelope(ctx.name, call.tool_call_id)
        if call.tool_name == CODE_TOOL:
            events.append(CodeAction(**call_env, code=str(call.args_as_dict().get("code", ""))))
        else:
            events.append(ToolCall(**call_env, tool_name=call.tool_name, args=call.args_as_dict()))
    return events, answer


async def collect_step(
    ctx: NodeContext, runtime: Runtime, turn: TurnRecord, ref: StepRef
) -> Outcome:
    """All subagents of the previous execution step have reported: hand every call's result
    to the model in the order of the calls."""
    history = await history_of(ctx, runtime)
    spawner = StepRef(ref.session_id, ref.agent_id, ref.turn_id, ref.step_no - 1, "execution")
    raw = await ctx.redis.hgetall(ctx.keys.step_results(spawner.id))
    recorded = {text(k): json.loads(v) for k, v in raw.items() if v != b"started"}
    returns, events = [], []
    for call in tool_calls(history[-1]):
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
            events.append(output_event(call, turn.envelope(ctx.name, call.tool_call_id), outcome))
    return Advance("model", [dump_message(ModelRequest(parts=returns))], events)
