"""Admission: an agent new to a full node waits in Redis, not as a message bouncing between
queues, and every node admits the waiting agents, first come first served within a
priority, as soon as it has room (a turn ended there, an idle runtime was reaped).

The waiting set holds first steps of agents (`StepRef` members). A step stays in the
dispatch set while it waits, so one popped by a node that dies before sending it is sent
again by the redispatch sweep; that sweep leaves waiting steps alone.
"""

from __future__ import annotations

import asyncio
import logging
import time

from actfleet.broker.records import CURRENT_STEP, BadRecord, StepRef, running_step
from actfleet.broker.transitions import text
from actfleet.workers.context import NodeContext
from actfleet.workers.runtimes import Runtimes

log = logging.getLogger("actfleet.admission")

PRIORITY_WEIGHT = 1e10
"""Seconds one priority level outweighs in the waiting order (centuries: priority first)."""


def waiting_score(priority: int, now: float) -> float:
    """Lower is admitted first: higher priority, then earlier arrival."""
    return now - priority * PRIORITY_WEIGHT


async def current_priority(ctx: NodeContext, ref: StepRef) -> int | None:
    """The priority of the step's turn when the step is its turn's current one, else None
    (the turn ended or moved on: the step is a leftover or junk)."""
    values = await ctx.redis.hmget(ctx.keys.turn(ref.turn_id), *CURRENT_STEP, "priority")
    if running_step(ref.session_id, ref.agent_id, ref.turn_id, values[:3]) != ref:
        return None
    try:
        return int(text(values[3] or b"0"))
    except ValueError:
        return 0


class Admission:
    """This node's side of the waiting set."""

    def __init__(self, ctx: NodeContext, runtimes: Runtimes):
        self.ctx, self.runtimes = ctx, runtimes
        self._lock = asyncio.Lock()
        self._again = False

    async def others_waiting(self) -> bool:
        """Whether agents wait already (a newcomer then queues behind them)."""
        return bool(await self.ctx.redis.zcard(self.ctx.keys.admission()))

    async def wait(self, ref: StepRef, priority: int) -> None:
        """Put an agent's step in the waiting set (once: a step sent again keeps its place)
        and tell every node, so one with room admits it."""
        ctx = self.ctx
        score = waiting_score(priority, time.time())
        await ctx.redis.zadd(ctx.keys.admission(), {ref.encode(): score}, nx=True)
        await ctx.redis.publish(ctx.keys.admit(), ctx.name)

    async def admit(self) -> None:
        """Admit waiting agents while this node has room; each admitted agent's runtime is
        made here and its step sent to this node's queue. Calls made while one runs are
        folded into one more round."""
        if self._lock.locked():
            self._again = True
            return
        async with self._lock:
            self._again = True
            while self._again:
                self._again = False
                await self._admit_while_room()

    async def _admit_while_room(self) -> None:
        ctx, key = self.ctx, self.ctx.keys.admission()
        while await self.runtimes.has_room():
            popped = await ctx.redis.zpopmin(key)
            if not popped:
                return
            member, score = popped[0]
            try:
                ref = StepRef.decode(member)
            except BadRecord as exc:
                await ctx.dead_letter(key, member, str(exc))
                continue
            if await current_priority(ctx, ref) is None:
                log.info("dropped waiting %s: its turn ended or moved on", ref.encode())
                continue
            placed = await self.runtimes.obtain(ref.session_id, ref.agent_id)
            if placed is None:  # another agent took the room meanwhile
                await ctx.redis.zadd(key, {member: score}, nx=True)
                return
            queue = placed if isinstance(placed, str) else ctx.queue
            log.info("admitted %s (queue %s)", ref.encode(), queue)
            ctx.publish(ref, queue)
