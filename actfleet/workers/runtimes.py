"""The runtimes a node holds: per agent, a lease in Redis, a working directory and a
kernel. A node admits new agents only below its capacity; idle runtimes are reaped."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actfleet.broker.events import KernelRestarted
from actfleet.broker.state import take_lease, text
from actfleet.broker.stream import emit

if TYPE_CHECKING:
    from actfleet.workers.kernel import Kernel
    from actfleet.workers.node import Node

RESTART_NOTICE = (
    "[actfleet] The kernel was restarted ({reason}): variables, imports and definitions "
    "from earlier cells are gone; files in the working directory remain where the node did."
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
    notice: str = ""
    """Told to the model with the next execution result (the kernel restarted)."""
    history: list[Any] = field(default_factory=list)
    """The agent's parsed messages, as far as they were read (see `history_of`)."""
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Runtimes:
    """The table of this node's runtimes, with their leases."""

    def __init__(self, node: Node, capacity: int):
        self.node = node
        self.capacity = capacity
        self.table: dict[tuple[str, str], Runtime] = {}

    async def obtain(self, session_id: str, agent_id: str) -> Runtime | str | None:
        """The agent's runtime on this node; or the queue of the live node that holds it;
        or None when this node is full."""
        node, key = self.node, (session_id, agent_id)
        if key not in self.table and not await self._make_room():
            return None
        verdict, other = await take_lease(
            node.redis,
            node.keys,
            session_id=session_id,
            agent_id=agent_id,
            node=node.name,
            boot=node.boot,
            ttl=node.settings.lease_ttl,
        )
        if verdict == "other":
            self.table.pop(key, None)
            return node.keys.node_queue(other)
        runtime = self.table.get(key)
        if runtime is None:
            runtime = Runtime(session_id, agent_id, node.workdir / session_id / agent_id)
            runtime.workdir.mkdir(parents=True, exist_ok=True)
            agent_key = node.keys.agent(session_id, agent_id)
            async with node.redis.pipeline(transaction=True) as pipe:
                pipe.hincrby(agent_key, "epoch", 1)
                pipe.hmget(agent_key, "released", "active_turn", "parent_agent")
                pipe.hdel(agent_key, "released")
                epoch, (released, turn_id, parent), _ = await pipe.execute()
            runtime.parent_agent = text(parent or "")
            if epoch > 1:
                reason = text(released) if released else "its node died"
                reason = f"{reason}; the agent now runs on node {node.name}"
                runtime.notice = RESTART_NOTICE.format(reason=reason)
                restarted = KernelRestarted(
                    session_id=session_id,
                    agent_id=agent_id,
                    turn_id=text(turn_id or ""),
                    node=node.name,
                    reason=reason,
                )
                await emit(node.redis, node.keys, node.settings.stream_maxlen, [restarted])
            self.table[key] = runtime
            runtime.starting = asyncio.ensure_future(node.pool.acquire(runtime.workdir))
        runtime.last_used = time.monotonic()
        return runtime

    async def kernel(self, runtime: Runtime) -> Kernel:
        """The runtime's kernel, taken from the warm pool on first use."""
        if runtime.kernel is None:
            if runtime.starting is None:
                await self._make_room(runtime)
                runtime.starting = asyncio.ensure_future(self.node.pool.acquire(runtime.workdir))
            runtime.kernel = await runtime.starting
        return runtime.kernel

    async def _make_room(self, asking: Runtime | None = None) -> bool:
        """Whether one more agent fits. A runtime counts while it holds a kernel or runs a
        step (a parked agent without a kernel costs nothing); when full, the least recently
        used idle runtime is released."""
        busy = [
            r
            for r in self.table.values()
            if r is not asking and (r.kernel or r.starting or r.lock.locked())
        ]
        if len(busy) < self.capacity:
            return True
        idle = [r for r in busy if not r.lock.locked()]
        if not idle:
            return False
        victim = min(idle, key=lambda r: r.last_used)
        await self.release(victim, f"it was evicted to make room on node {self.node.name}")
        return True

    def lease_keys(self) -> list[str]:
        return [self.node.keys.lease(s, a) for s, a in self.table]

    async def release(self, runtime: Runtime, why: str) -> None:
        """Drop a runtime: its kernel stops, its lease and membership go; `why` is what the
        model is told when the agent next runs."""
        node = self.node
        self.table.pop((runtime.session_id, runtime.agent_id), None)
        await node.redis.hset(
            node.keys.agent(runtime.session_id, runtime.agent_id), "released", why
        )
        if runtime.kernel is None and runtime.starting is not None:
            runtime.starting.cancel()
            with contextlib.suppress(BaseException):
                runtime.kernel = await runtime.starting
        if runtime.kernel is not None:
            await runtime.kernel.shutdown()
        lease = node.keys.lease(runtime.session_id, runtime.agent_id)
        if text(await node.redis.get(lease) or "") == f"{node.name}|{node.boot}":
            await node.redis.delete(lease)
        await node.redis.srem(
            node.keys.node_agents(node.name), f"{runtime.session_id}/{runtime.agent_id}"
        )

    async def reap_idle(self) -> None:
        """Release runtimes idle past `runtime_idle_timeout` that run nothing."""
        limit = time.monotonic() - self.node.settings.runtime_idle_timeout
        for runtime in list(self.table.values()):
            if runtime.last_used < limit and not runtime.lock.locked():
                await self.release(runtime, "it was idle too long and was reaped")

    async def close(self) -> None:
        why = f"node {self.node.name} stopped"
        await asyncio.gather(*(self.release(r, why) for r in list(self.table.values())))
