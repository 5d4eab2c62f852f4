"""A node's side of the reply channel: the policy applied to a model response's calls and
to the shell commands of a running cell; waiting for a decision inside a cell (pub/sub, with
a poll as a safety net); expiring overdue requests; re-sending steps a client sent but no
node claimed (so a decision is never lost)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from actfleet.broker.approvals import (
    DECIDE_LUA,
    OPEN_REQUEST_LUA,
    ApprovalRecord,
    decide_args,
    dispatch_member,
)
from actfleet.broker.events import ApprovalDecision, ApprovalRequest, encode
from actfleet.broker.policy import Policy, split_shell
from actfleet.broker.state import text
from actfleet.broker.stream import emit, stamp
from actfleet.workers.models import CODE_TOOL, SUBAGENT_TOOL
from actfleet.workers.turn import send_member

if TYPE_CHECKING:
    from pydantic_ai.messages import ToolCallPart

    from actfleet.workers.node import Node
    from actfleet.workers.turn import Turn

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
    """Per node: waiting for decisions and the sweeps that keep the channel whole."""

    def __init__(self, node: Node):
        self.node = node
        self._wakers: dict[str, asyncio.Event] = {}
        self._listener: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._pubsub = self.node.redis.pubsub()
        await self._pubsub.subscribe(self.node.keys.decided(), self.node.keys.cancels())
        self._listener = asyncio.ensure_future(self._listen())

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
        await self._pubsub.aclose()

    async def _listen(self) -> None:
        while True:
            try:
                async for message in self._pubsub.listen():
                    if message["type"] != "message":
                        continue
                    if text(message["channel"]) == self.node.keys.cancels():
                        self.node.cancel_running(text(message["data"]))
                    elif (waker := self._wakers.get(text(message["data"]))) is not None:
                        waker.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("decision listener failed; resubscribing")
                await asyncio.sleep(1)

    async def record(self, request_id: str) -> ApprovalRecord:
        return ApprovalRecord.from_hash(
            await self.node.redis.hgetall(self.node.keys.approval(request_id))
        )

    async def open(self, record: ApprovalRecord, parent_corr_id: str = "") -> None:
        """Open a request a running cell waits on, and announce it."""
        node = self.node
        event = encode(stamp(request_event(record, node.name, parent_corr_id)))
        await node.redis.eval(
            OPEN_REQUEST_LUA,
            2,
            node.keys.seq(record.session_id),
            node.keys.stream(record.session_id),
            node.keys.prefix,
            node.settings.stream_maxlen,
            record.to_json(),
            event,
        )

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
        for request_id in await self.node.redis.zrange(self.node.keys.approvals(session_id), 0, -1):
            record = await self.record(text(request_id))
            if record.turn_id == turn_id and record.status == "pending":
                await self.close_request(record, "withdrawn", reason)

    async def close_request(self, record: ApprovalRecord, status: str, reason: str) -> None:
        """End a pending request without a human: `expired` or `withdrawn`."""
        node = self.node
        args = decide_args(
            node.keys,
            node.settings.stream_maxlen,
            record,
            status=status,
            args_sha="",
            approver="actfleet",
            reason=reason,
            node=node.name,
        )
        result = await node.redis.eval(DECIDE_LUA, 0, *args)
        if text(result[1]) == "resume":
            self._resend(text(result[2]))

    async def sweep(self) -> None:
        """Expire overdue requests; re-send steps that waited unclaimed too long."""
        node, now = self.node, time.time()
        for rid in await node.redis.zrangebyscore(
            node.keys.approvals_expiry(), 0, now, start=0, num=100
        ):
            record = await self.record(text(rid))
            if record.status == "pending":
                await self.close_request(record, "expired", "")
        stale = now - node.settings.redispatch_after
        for member in await node.redis.zrangebyscore(
            node.keys.dispatch(), 0, stale, start=0, num=100
        ):
            member = text(member)
            await node.redis.zadd(node.keys.dispatch(), {member: now})
            self._resend(member)

    def _resend(self, member: str) -> None:
        asyncio.ensure_future(send_member(self.node, member))


@dataclass
class ShellGate:
    """Decides the shell commands of one running cell under the turn's policy; each part of
    a composite command separately. Records why a command was refused."""

    node: Node
    policy: Policy
    envelope: dict[str, Any]
    timeout: float | None
    refusals: list[str] = field(default_factory=list)

    async def __call__(self, cmd: str) -> bool:
        node, env = self.node, self.envelope
        for part in split_shell(cmd):
            verdict, rule = self.policy.decide("shell", part)
            if verdict == "deny":
                await emit(
                    node.redis,
                    node.keys,
                    node.settings.stream_maxlen,
                    [refused_event(env, part, rule)],
                )
                self.refusals.append(f"shell command `{part}` was denied by rule {rule}")
                return False
            if verdict == "ask":
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
                await node.approvals.open(record, env["parent_corr_id"])
                decided = await node.approvals.wait(record.id)
                if decided.status != "approved":
                    why = f": {decided.reason}" if decided.reason else ""
                    self.refusals.append(
                        f"shell command `{part}` was {decided.status} by {decided.approver}{why}"
                    )
                    return False
        return True


def apply_policy(
    turn: Turn, calls: list[ToolCallPart], exec_step_no: int
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
                timeout=turn.approval_timeout,
                corr_id=call.tool_call_id,
                dispatch=resume,
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
