"""The heartbeat's sweeps, each safe to run on every node at once: steps sent again when
nothing progresses them, overdue approval requests expired, subagents waiting for a slot
started, the sessions index pruned past retention. One bad entry is skipped with a reason,
never stopping a sweep."""

from __future__ import annotations

import logging
import time

from actfleet.broker.records import CURRENT_STEP, BadRecord, StepRef, running_step
from actfleet.broker.transitions import text
from actfleet.workers.approvals import Approvals
from actfleet.workers.context import NodeContext
from actfleet.workers.outcome import start_children

log = logging.getLogger("actfleet.sweeps")

BATCH = 100
"""Entries a sweep looks at per beat."""


async def redispatch(ctx: NodeContext, running: set[str]) -> None:
    """Send again every current step that nothing has progressed for `redispatch_after`
    seconds: never claimed (its message was lost: a client or node died right after the
    transition, a Redis outage cut the send), or claimed by a node that no longer runs it.
    Steps this node runs, and steps waiting for room (admission.py), are touched instead;
    duplicates are refused by the claim."""
    now = time.time()
    dispatch = ctx.keys.dispatch()
    if running:
        await ctx.redis.zadd(dispatch, dict.fromkeys(running, now), xx=True)
    stale = now - ctx.settings.redispatch_after
    for member in await ctx.redis.zrangebyscore(dispatch, 0, stale, start=0, num=BATCH):
        if await ctx.redis.zscore(ctx.keys.admission(), member) is not None:
            await ctx.redis.zadd(dispatch, {member: now}, xx=True)
            continue
        try:
            ref = StepRef.decode(member)
        except BadRecord as exc:
            if await ctx.redis.zrem(dispatch, member):  # once, though every node sweeps
                await ctx.dead_letter(dispatch, member, str(exc))
            continue
        current = await ctx.redis.hmget(ctx.keys.turn(ref.turn_id), *CURRENT_STEP)
        if running_step(ref.session_id, ref.agent_id, ref.turn_id, current) != ref:
            # Every transition that adds a step makes it its running turn's current one,
            # and the commit that moves on takes it out: this one is junk or a leftover.
            if await ctx.redis.zrem(dispatch, member):
                reason = "not its turn's current step (the turn is gone, ended or moved on)"
                await ctx.dead_letter(dispatch, member, reason)
            continue
        await ctx.redis.zadd(dispatch, {ref.encode(): now}, xx=True)
        log.info("sending %s again: nothing progressed it", ref.encode())
        await ctx.send([ref])


async def expire_approvals(ctx: NodeContext, approvals: Approvals) -> None:
    """Close overdue pending requests as expired (a parked turn then resumes, rejected)."""
    for rid in await ctx.redis.zrangebyscore(
        ctx.keys.approvals_expiry(), 0, time.time(), start=0, num=BATCH
    ):
        request_id = text(rid)
        try:
            record = await approvals.record(request_id)
        except BadRecord as exc:
            await _drop_broken_request(ctx, request_id, str(exc))
            continue
        if record.status == "pending":
            await approvals.close_request(record, "expired", "")


async def _drop_broken_request(ctx: NodeContext, request_id: str, reason: str) -> None:
    """Take an unreadable request out of the indexes (once), keeping it as a dead letter."""
    removed = await ctx.redis.zrem(ctx.keys.approvals_expiry(), request_id)
    await ctx.redis.zrem(ctx.keys.approvals(), request_id)
    if removed:
        await ctx.dead_letter(ctx.keys.approval(request_id), b"", reason)


async def pump_children(ctx: NodeContext) -> None:
    """Start subagents waiting for a slot whose caps allow them now (slots free up when a
    child's node dies and its slot lease lapses)."""
    for member in await ctx.redis.smembers(ctx.keys.pumps()):
        try:
            session_id, parent, cap = text(member).split("|")
            await start_children(ctx, session_id, parent, int(cap))
        except (ValueError, BadRecord) as exc:
            if await ctx.redis.srem(ctx.keys.pumps(), member):  # once, though every node sweeps
                await ctx.dead_letter(ctx.keys.pumps(), member, str(exc))


async def prune_sessions(ctx: NodeContext) -> None:
    """Drop sessions idle past retention from the sessions index (their keys expire)."""
    if ctx.settings.retention > 0:
        cutoff = time.time() - ctx.settings.retention
        await ctx.redis.zremrangebyscore(ctx.keys.sessions(), 0, cutoff)
