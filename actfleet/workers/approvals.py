"""A node's side of the reply channel: the policy applied to a model response's calls and
to the shell commands of a running cell; waiting for a decision inside a cell (pub/sub,
with a poll as a safety net); closing requests without a human (expired, withdrawn)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from actfleet.broker import transitions
from actfleet.broker.events import ApprovalDecision, ApprovalRequest
from actfleet.broker.ids import is_valid_id
from actfleet.broker.policy import Policy
from actfleet.broker.records import ApprovalRecord, BadRecord, StepRef, TurnRecord
from actfleet.broker.transitions import DecisionStatus, text
from actfleet.workers.context import NodeContext
from actfleet.workers.models import CODE_TOOL, SUBAGENT_TOOL, tool_names

if TYPE_CHECKING:
    from pydantic_ai.messages import ToolCallPart

log = logging.getLogger("actfleet.approvals")


def request_event(record: ApprovalRecord, node: str, parent_corr_id: str = "") -> ApprovalRequest:
    return ApprovalRequest(
        session_id=record.session_id,
        agent_id=record.agent_id,
        turn_id=record.turn_id,
        corr_id=record.corr_id,
        parent_corr_id=parent_corr_id,
        node=node,
        request_id=record.id,
        kind=record.kind,
        tool_name=record.tool_name,
        args=record.args,
        args_sha256=record.args_sha256,
        expires_at=record.expires_at,
    )


def refused_event(envelope: dict[str, Any], subject: str, rule: str) -> ApprovalDecision:
    """The record of a call a deny rule refused without asking."""
    return ApprovalDecision(
        **envelope,
        request_id="",
        approved=False,
        approver="policy",
        reason=f"denied by rule {rule}: {subject}",
    )


class Approvals:
    """Per node: requests opened by running cells, waiting for their decisions, and
    closing requests no human decides. `on_cancel` is told each cancelled session;
    `on_admit` each time an agent waits for room (the listener serves that channel too)."""

    def __init__(
        self,
        ctx: NodeContext,
        on_cancel: Callable[[str], None],
        on_admit: Callable[[], Awaitable[None]],
    ):
        self.ctx = ctx
        self._on_cancel = on_cancel
        self._on_admit = on_admit
        self._wakers: dict[str, asyncio.Event] = {}
        self._listener: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._listener = asyncio.ensure_future(self._listen())

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(BaseException):
                await self._listener

    async def _listen(self) -> None:
        """Decisions wake the cells waiting on them; cancels stop the session's steps; an
        agent waiting for room is admitted if this node has some. A lost connection is
        re-subscribed; a junk message is skipped."""
        keys = self.ctx.keys
        while True:
            pubsub = self.ctx.redis.pubsub()
            try:
                await pubsub.subscribe(keys.decided(), keys.cancels(), keys.admit())
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        await self._heard(text(message["channel"]), message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("decision listener lost its connection (%s); resubscribing", exc)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _heard(self, channel: str, data: bytes) -> None:
        """One message of the reply channels. It only says where to look: a cancel is
        acted on once the session's cancel key confirms it; a decision wakes the cell
        waiting on that request, which reads the record. Junk is dead-lettered."""
        ctx = self.ctx
        if channel == ctx.keys.admit():  # a wake-up: what it carries is not read
            await self._on_admit()
            return
        name = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        if not is_valid_id(name):
            reason = f"not a valid id on the {channel} channel"
            await ctx.dead_letter(channel, data, reason)
        elif channel == ctx.keys.decided():
            if (waker := self._wakers.get(name)) is not None:
                waker.set()
        elif await ctx.redis.exists(ctx.keys.cancel(name)):
            self._on_cancel(name)
        else:
            log.warning("ignoring a cancel of session %s: it was not cancelled", name)

    async def record(self, request_id: str) -> ApprovalRecord:
        """A request's record; BadRecord when it is missing or broken."""
        raw = await self.ctx.redis.hgetall(self.ctx.keys.approval(request_id))
        return ApprovalRecord.from_hash(raw, request_id)

    async def open(self, record: ApprovalRecord, parent_corr_id: str = "") -> None:
        """Open a request a running cell waits on, and announce it."""
        ctx = self.ctx
        event = request_event(record, ctx.name, parent_corr_id)
        await transitions.open_request(ctx.keys, ctx.settings, record, event).arun(ctx.redis)

    async def wait(self, request_id: str) -> ApprovalRecord:
        """Block (on this loop only) until the request is decided; return the record."""
        waker = self._wakers.setdefault(request_id, asyncio.Event())
        try:
            while True:
                record = await self.record(request_id)
                if record.status != "pending":
                    return record
                waker.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waker.wait(), timeout=1.0)
        finally:
            self._wakers.pop(request_id, None)

    async def withdraw_turn(self, session_id: str, turn_id: str, reason: str) -> None:
        """Withdraw every pending request of a turn (it is ending)."""
        pending = await self.ctx.redis.zrange(self.ctx.keys.approvals(session_id), 0, -1)
        for request_id in pending:
            try:
                record = await self.record(text(request_id))
            except BadRecord as exc:
                log.warning("skipping approval request %s: %s", text(request_id), exc)
                continue
            if record.turn_id == turn_id and record.status == "pending":
                await self.close_request(record, "withdrawn", reason)

    async def close_request(
        self, record: ApprovalRecord, status: DecisionStatus, reason: str
    ) -> None:
        """End a pending request without a human: `expired` or `withdrawn`."""
        ctx = self.ctx
        decision = await transitions.decide(
            ctx.keys,
            ctx.settings,
            record,
            status=status,
            args_sha="",
            approver="actfleet",
            reason=reason,
            decision_id=uuid.uuid4().hex,
            node=ctx.name,
        ).arun(ctx.redis)
        if decision.resume is not None:
            await ctx.send([decision.resume])


@dataclass
class ShellGate:
    """Decides the shell commands of one running cell under the turn's policy; each command
    the line runs separately (Policy.decide_shell). Records why a command was refused."""

    approvals: Approvals
    policy: Policy
    envelope: dict[str, Any]
    timeout: float | None
    refusals: list[str] = field(default_factory=list)

    async def __call__(self, cmd: str) -> bool:
        ctx, env = self.approvals.ctx, self.envelope
        verdicts = self.policy.decide_shell(cmd)
        for part, verdict, rule, _ in verdicts:  # a denied part refuses before anyone is asked
            if verdict == "deny":
                await ctx.emit([refused_event(env, part, rule)])
                self.refusals.append(f"shell command `{part}` was denied by rule {rule}")
                return False
        for part, verdict, rule, why in verdicts:
            if verdict == "ask":
                log.debug("shell command %r asks: %s", part, why or f"rule {rule}")
                record = ApprovalRecord.new(
                    session_id=env["session_id"],
                    agent_id=env["agent_id"],
                    turn_id=env["turn_id"],
                    kind="shell",
                    tool_name="shell",
                    args={"cmd": part},
                    timeout=self.timeout,
                    scope="cell",
                    corr_id=env["corr_id"],
                )
                await self.approvals.open(record, env["parent_corr_id"])
                decided = await self.approvals.wait(record.id)
                if decided.status != "approved":
                    why = f": {decided.reason}" if decided.reason else ""
                    self.refusals.append(
                        f"shell command `{part}` was {decided.status} by {decided.approver}{why}"
                    )
                    return False
        return True


def apply_policy(
    turn: TurnRecord, calls: list[ToolCallPart], execution: StepRef, mcp_tools: Sequence[str] = ()
) -> tuple[dict[str, dict[str, str]], list[ApprovalRecord]]:
    """Each call's verdict under the turn's policy, and the requests to open for those that
    need a human (each resumes `execution`). A deny anywhere opens none: the turn ends
    rejected. A call of a tool the agent was not offered asks nobody: it runs nothing and
    its result is an error naming the tools (as freeact answers it). `mcp_tools` are the
    MCP tools offered besides the agent's own (kind `tool`)."""
    policy = policy_of(turn.options)
    offered = [*tool_names(turn.is_subagent), *mcp_tools]
    decisions: dict[str, dict[str, str]] = {}
    requests: list[ApprovalRecord] = []
    for call in calls:
        if call.tool_name not in offered:
            decisions[call.tool_call_id] = {"verdict": "unknown", "rule": ""}
            continue
        args = call.args_as_dict()
        kind, subject = action_of(call.tool_name, args)
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
                timeout=turn.options.get("approval_timeout"),
                corr_id=call.tool_call_id,
                dispatch=execution.encode(),
            )
            decisions[call.tool_call_id]["request"] = record.id
            requests.append(record)
    if any(d["verdict"] == "deny" for d in decisions.values()):
        return decisions, []
    return decisions, requests


def action_of(tool_name: str, args: dict[str, Any]) -> tuple[str, str]:
    """A call's approval kind and the subject its rules match on."""
    if tool_name == CODE_TOOL:
        return "code", str(args.get("code", ""))
    if tool_name == SUBAGENT_TOOL:
        return "subagent", str(args.get("prompt", ""))
    return "tool", tool_name


def policy_of(options: dict[str, Any]) -> Policy:
    return Policy.from_data(options.get("approval") or {"mode": "ask"})
