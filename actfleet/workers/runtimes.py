"""The runtimes a node holds: per agent, a lease in Redis, a working directory and a
kernel. A node admits new agents only below its capacity; idle runtimes are reaped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actfleet.broker import transitions
from actfleet.broker.events import KernelRestarted
from actfleet.broker.ids import check_id
from actfleet.broker.records import AgentRecord
from actfleet.broker.transitions import text
from actfleet.workers.context import NodeContext

if TYPE_CHECKING:
    from actfleet.workers.kernel import Kernel
    from actfleet.workers.kernel_pool import KernelPool

log = logging.getLogger("actfleet.runtimes")

RESTART_NOTICE = (
    "[actfleet] The kernel was restarted ({reason}): variables, imports and definitions "
    "from earlier cells are gone, and files written to the working directory may be gone too."
)


@dataclass
class Runtime:
    """What an agent holds on this node."""

    session_id: str
    agent_id: str
    workdir: Path
    kernel: Kernel | None = None
    starting: asyncio.Future[Kernel] | None = None
    """The kernel being taken from the pool since the runtime was made (overlapping the
    model step)."""
    parent_agent: str = ""
    """For a subagent: its parent (whose slots this runtime renews)."""
    network: str = ""
    """The session's kernel network ("none"), or "" for the node's."""
    notice: str = ""
    """Told to the model with the next execution result (the kernel restarted)."""
    history: list[Any] = field(default_factory=list)
    """The agent's parsed messages, as far as they were read (see `history_of`)."""
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Runtimes:
    """The table of this node's runtimes, with their leases."""

    def __init__(self, ctx: NodeContext, pool: KernelPool, workdir: Path, capacity: int):
        self.ctx, self.pool, self.workdir, self.capacity = ctx, pool, workdir, capacity
        self.table: dict[tuple[str, str], Runtime] = {}
        self._releasing: dict[tuple[str, str], asyncio.Future[None]] = {}
        """Agents whose runtime is being released, until it is done."""
        self._admitting = asyncio.Lock()
        """Held while a new agent's room is made and its runtime put in the table."""

    def holds(self, session_id: str, agent_id: str) -> bool:
        return (session_id, agent_id) in self.table

    async def obtain(self, session_id: str, agent_id: str) -> Runtime | str | None:
        """The agent's runtime on this node; or the queue of the live node that holds it;
        or None when this node is full."""
        key = (session_id, agent_id)
        while True:
            # A runtime of this agent being released is let go first: its release removes
            # the working directory and the lease that a runtime made meanwhile would use.
            while (releasing := self._releasing.get(key)) is not None:
                await asyncio.shield(releasing)
            if key in self.table:
                placed = await self._place(session_id, agent_id)
            else:
                # Room is checked and taken in one go: agents arriving together cannot all
                # see the last free kernel (each check awaits Redis before the runtime is
                # in the table).
                async with self._admitting:
                    if key not in self.table and not await self._make_room(
                        for_subagent=agent_id != "main"
                    ):
                        return None
                    placed = await self._place(session_id, agent_id)
            if placed is not None:
                return placed

    async def _place(self, session_id: str, agent_id: str) -> Runtime | str | None:
        """Take the agent's lease and its runtime (made when new); the holder's queue when
        another live node holds it; None when the runtime was evicted meanwhile (try again)."""
        ctx, key = self.ctx, (session_id, agent_id)
        verdict, other = await transitions.take_lease(
            ctx.keys, session_id, agent_id, node=ctx.name, boot=ctx.boot, ttl=ctx.settings.lease_ttl
        ).arun(ctx.redis)
        if verdict == "other":
            self.table.pop(key, None)
            return ctx.keys.node_queue(other)
        if key in self._releasing:
            return None  # evicted while the lease was renewed: wait, then take it again
        runtime = self.table.get(key)
        if runtime is None:
            runtime = await self._make(session_id, agent_id)
        runtime.last_used = time.monotonic()
        return runtime

    async def _make(self, session_id: str, agent_id: str) -> Runtime:
        """A new runtime: its working directory (always inside the node's), its agent's
        epoch counted (above 1, the model is told its kernel restarted), a kernel taken
        from the pool while the step goes on."""
        ctx = self.ctx
        workdir = self.workdir / check_id(session_id, "session id") / check_id(agent_id, "agent id")
        if not workdir.resolve().is_relative_to(self.workdir.resolve()):
            raise ValueError(f"working directory {workdir} is outside {self.workdir}")
        runtime = Runtime(session_id, agent_id, workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        agent_key = ctx.keys.agent(session_id, agent_id)
        async with ctx.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(agent_key, AgentRecord.EPOCH, 1)
            pipe.hgetall(agent_key)
            pipe.hdel(agent_key, AgentRecord.RELEASED, AgentRecord.KEPT)
            pipe.hget(ctx.keys.session(session_id), "network")
            _, raw, _, network = await pipe.execute()
        agent = AgentRecord.from_hash(raw)
        runtime.parent_agent = agent.parent_agent
        runtime.network = text(network or b"")
        if agent.epoch > 1 and not agent.kept:
            reason = agent.released or "its node died"
            reason = f"{reason}; the agent now runs on node {ctx.name}"
            runtime.notice = RESTART_NOTICE.format(reason=reason)
            restarted = KernelRestarted(
                session_id=session_id,
                agent_id=agent_id,
                turn_id=agent.active_turn,
                node=ctx.name,
                reason=reason,
            )
            await ctx.emit([restarted])
        self.table[(session_id, agent_id)] = runtime
        runtime.starting = asyncio.ensure_future(self.pool.acquire(workdir, runtime.network))
        return runtime

    async def kernel(self, runtime: Runtime) -> Kernel:
        """The runtime's kernel, taken from the warm pool on first use."""
        if runtime.kernel is None:
            if runtime.starting is None:
                await self._make_room(runtime)
                kernel = self.pool.acquire(runtime.workdir, runtime.network)
                runtime.starting = asyncio.ensure_future(kernel)
            runtime.kernel = await runtime.starting
        return runtime.kernel

    async def has_room(self, for_subagent: bool = False) -> bool:
        """Whether one more agent fits now, counting an evictable runtime as room."""
        busy = self._busy()
        return len(busy) < self.capacity or await self._victim(busy, for_subagent) is not None

    async def _make_room(self, asking: Runtime | None = None, for_subagent: bool = False) -> bool:
        """Whether one more agent fits. A runtime counts while it holds a kernel or runs a
        step (a parked agent without a kernel costs nothing); when full, one is evicted if
        that loses nothing its turn needs (`_victim`)."""
        busy = self._busy(asking)
        if len(busy) < self.capacity:
            return True
        victim = await self._victim(busy, for_subagent)
        if victim is None:
            return False
        await self.release(victim, f"it was evicted to make room on node {self.ctx.name}")
        return True

    def _busy(self, asking: Runtime | None = None) -> list[Runtime]:
        return [
            r
            for r in self.table.values()
            if r is not asking and (r.kernel or r.starting or r.lock.locked())
        ]

    async def _victim(self, busy: list[Runtime], for_subagent: bool) -> Runtime | None:
        """The runtime to evict, least recently used first: one whose agent has no turn in
        progress; else one whose turn is parked for an approval and whose kernel never ran
        a cell (nothing is lost: its agent's next runtime is not told of a restart). Never
        one running a step or holding kernel state its turn still needs. A subagent may also
        take the room of an agent parked until its subagents report (else a node full of
        such parents would wait for children that can never start); that agent's next step
        gets the restart notice."""
        idle = sorted((r for r in busy if not r.lock.locked()), key=lambda r: r.last_used)
        if not idle:
            return None
        used = {id(r): r.last_used for r in idle}

        def untouched(r: Runtime) -> bool:
            """Still idle after the reads below (a step may have taken it meanwhile); the
            caller releases it before yielding again."""
            held = self.table.get((r.session_id, r.agent_id)) is r
            return held and not r.lock.locked() and r.last_used == used[id(r)]

        ctx = self.ctx
        async with ctx.redis.pipeline(transaction=False) as pipe:
            for r in idle:
                pipe.hget(ctx.keys.agent(r.session_id, r.agent_id), AgentRecord.ACTIVE_TURN)
            turns = [text(t or b"") for t in await pipe.execute()]
        pairs = zip(idle, turns, strict=True)
        if (free := next((r for r, t in pairs if not t and untouched(r)), None)) is not None:
            return free
        async with ctx.redis.pipeline(transaction=False) as pipe:
            for turn_id in turns:
                pipe.hmget(ctx.keys.turn(turn_id), "status", "step_kind")
            states = [(text(s or b""), text(k or b"")) for s, k in await pipe.execute()]
        for runtime, state in zip(idle, states, strict=True):
            if state == ("parked", "execution") and runtime.kernel is None and untouched(runtime):
                return runtime
        if for_subagent:
            for runtime, state in zip(idle, states, strict=True):
                if state == ("parked", "collect") and untouched(runtime):
                    return runtime
        return None

    def lease_keys(self) -> list[str]:
        return [self.ctx.keys.lease(s, a) for s, a in self.table]

    async def release(self, runtime: Runtime, why: str) -> None:
        """Drop a runtime: its kernel stops, its lease and membership go, its working
        directory is removed (unless ACTFLEET_KEEP_WORKDIRS); `why` is what the model is
        told when the agent next runs."""
        key = (runtime.session_id, runtime.agent_id)
        self.table.pop(key, None)
        done = asyncio.get_running_loop().create_future()
        self._releasing[key] = done
        try:
            await self._release(runtime, why)
        finally:
            if self._releasing.get(key) is done:
                del self._releasing[key]
            done.set_result(None)

    async def _release(self, runtime: Runtime, why: str) -> None:
        ctx = self.ctx
        # Nothing is lost when the kernel never ran a cell and no notice is still owed.
        lost = {AgentRecord.RELEASED: why, AgentRecord.KEPT: 0}
        if runtime.kernel is None and not runtime.notice:
            lost = {AgentRecord.RELEASED: "", AgentRecord.KEPT: 1}
        if runtime.kernel is None and runtime.starting is not None:
            runtime.starting.cancel()
            with contextlib.suppress(BaseException):
                runtime.kernel = await runtime.starting
        if runtime.kernel is not None:
            await runtime.kernel.shutdown()
        await ctx.mcp.release_runtime((runtime.session_id, runtime.agent_id))
        if not ctx.settings.keep_workdirs:
            await asyncio.to_thread(shutil.rmtree, runtime.workdir, True)
        lease = ctx.keys.lease(runtime.session_id, runtime.agent_id)
        async with ctx.redis.pipeline(transaction=False) as pipe:
            pipe.hset(ctx.keys.agent(runtime.session_id, runtime.agent_id), mapping=lost)
            pipe.get(lease)
            _, holder = await pipe.execute()
        if text(holder or "") == f"{ctx.name}|{ctx.boot}":
            await ctx.redis.delete(lease)
        await ctx.redis.srem(
            ctx.keys.node_agents(ctx.name), f"{runtime.session_id}/{runtime.agent_id}"
        )

    async def reap_idle(self) -> None:
        """Release runtimes idle past `runtime_idle_timeout` that run nothing."""
        limit = time.monotonic() - self.ctx.settings.runtime_idle_timeout
        for runtime in list(self.table.values()):
            if runtime.last_used < limit and not runtime.lock.locked():
                await self.release(runtime, "it was idle too long and was reaped")

    async def close(self) -> None:
        why = f"node {self.ctx.name} stopped"
        results = await asyncio.gather(
            *(self.release(r, why) for r in list(self.table.values())), return_exceptions=True
        )
        for error in (r for r in results if isinstance(r, BaseException)):
            log.warning("releasing a runtime failed (its lease will expire): %s", error)
