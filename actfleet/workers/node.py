"""A worker node: one asyncio loop thread that owns the kernels, model streams and Redis
connection; a heartbeat that renews the node's leases; and recovery of dead nodes' work.

Celery tasks run in pool threads and hand their coroutines to the loop with `call`.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import redis.asyncio as aioredis

from actfleet.broker.celery_app import make_celery, send_step
from actfleet.broker.keys import SHARED_QUEUE, Keys, node_queue
from actfleet.broker.settings import Settings
from actfleet.broker.state import lease_holder, text
from actfleet.workers.approvals import Approvals
from actfleet.workers.kernel_pool import KernelPool
from actfleet.workers.runtimes import Runtimes

log = logging.getLogger("actfleet.node")
T = TypeVar("T")


class Node:
    """One `actfleet worker` process."""

    def __init__(self, name: str, settings: Settings, capacity: int):
        self.name = name
        self.boot = uuid.uuid4().hex[:12]
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.queue = node_queue(name)
        self.celery = make_celery(settings)
        root = Path(settings.workdir) if settings.workdir else Path(tempfile.gettempdir())
        self.workdir = root / f"actfleet-{name}"
        self.runtimes = Runtimes(self, capacity)
        self.approvals = Approvals(self)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="actfleet-loop")
        self._heartbeat: asyncio.Task[None] | None = None
        self.redis: aioredis.Redis
        self.pool: KernelPool

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the node's loop from a task thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def send(self, kind: str, args: list[Any], queue: str) -> None:
        send_step(self.celery, kind, args, queue)

    def start(self) -> None:
        self._thread.start()
        self.call(self._start())

    async def _start(self) -> None:
        self.redis = aioredis.Redis.from_url(self.settings.redis_url)
        self.workdir.mkdir(parents=True, exist_ok=True)
        # A previous process under this name may have died holding agents: recover them.
        await self.recover(self.name, own=True)
        await self._beat()
        self.pool = KernelPool.from_settings(self.settings)
        await self.pool.start()
        await self.approvals.start()
        self._heartbeat = asyncio.ensure_future(self._heartbeat_loop())

    def stop(self) -> None:
        """Release every runtime, hand queued work back to the shared queue, stop."""
        try:
            self.call(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    async def _stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await self.approvals.close()
        await self.runtimes.close()
        await self._requeue(self.queue)
        await self.pool.close()
        await self.redis.srem(self.keys.nodes(), self.name)
        await self.redis.delete(self.keys.node(self.name))
        await self.redis.aclose()

    async def _beat(self) -> None:
        ttl = int(self.settings.lease_ttl * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.node(self.name), self.boot, px=ttl)
            pipe.sadd(self.keys.nodes(), self.name)
            for key in self.runtimes.lease_keys():
                pipe.pexpire(key, ttl)
            await pipe.execute()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval)
            try:
                await self._beat()
                for name in await self.redis.smembers(self.keys.nodes()):
                    name = text(name)
                    if name != self.name and not await self.redis.exists(self.keys.node(name)):
                        await self.recover(name)
                await self.runtimes.reap_idle()
                await self.approvals.sweep()
            except Exception:
                log.exception("heartbeat failed; retrying")

    async def recover(self, dead: str, *, own: bool = False) -> None:
        """Take over a dead node's work: its agents' current steps go back to the shared
        queue (a step it had started is reported as interrupted, never re-run)."""
        if not own and not await self.redis.set(
            self.keys.takeover(dead), self.name, nx=True, px=int(self.settings.lease_ttl * 1000)
        ):
            return
        members = await self.redis.smembers(self.keys.node_agents(dead))
        for member in members:
            session_id, agent_id = text(member).split("/", 1)
            lease = self.keys.lease(session_id, agent_id)
            if lease_holder(await self.redis.get(lease)) == dead:
                await self.redis.delete(lease)
            turn_id = await self.redis.hget(self.keys.agent(session_id, agent_id), "active_turn")
            if not turn_id:
                continue
            turn_id = text(turn_id)
            status, step_no, kind = await self.redis.hmget(
                self.keys.turn(turn_id), "status", "step_no", "step_kind"
            )
            if text(status or "") == "running":
                log.warning(
                    "recovering %s/%s turn %s from node %s", session_id, agent_id, turn_id, dead
                )
                self.send(
                    f"actfleet.{text(kind)}_step",
                    [session_id, agent_id, turn_id, int(step_no)],
                    SHARED_QUEUE,
                )
        await self._requeue(node_queue(dead))
        await self.redis.delete(self.keys.node_agents(dead))
        if not own:
            await self.redis.srem(self.keys.nodes(), dead)

    async def _requeue(self, queue: str) -> None:
        """Move the messages waiting on a node's queue to the shared queue."""
        while await self.redis.lmove(queue, SHARED_QUEUE, "RIGHT", "LEFT"):
            pass
