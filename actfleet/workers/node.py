"""A worker node: one asyncio loop thread that owns the kernels, model streams and Redis
connection; a heartbeat that renews the node's leases; and recovery of dead nodes' work.

Celery tasks run in pool threads and hand their coroutines to the loop with `call`.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import redis.asyncio as aioredis

from actfleet.broker.celery_app import make_celery, send_step, step_task
from actfleet.broker.keys import Keys
from actfleet.broker.settings import Settings
from actfleet.broker.state import lease_holder, text
from actfleet.workers.approvals import Approvals
from actfleet.workers.kernel_pool import KernelPool
from actfleet.workers.runtimes import Runtimes
from actfleet.workers.turn import start_children

log = logging.getLogger("actfleet.node")


class NodeNameTaken(RuntimeError):
    """Another live node has this name."""


def _keep_environment_private() -> None:
    """Make this process non-dumpable (Linux), so code in a kernel running as the same user
    cannot read the node's environment (provider keys) from /proc. Kernels are exec'd, so
    they are unaffected."""
    if sys.platform != "linux":
        return
    pr_set_dumpable = 4
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 0, 0, 0, 0)


T = TypeVar("T")


class Node:
    """One `actfleet worker` process."""

    def __init__(self, name: str, settings: Settings, capacity: int):
        self.name = name
        self.boot = uuid.uuid4().hex[:12]
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.queue = self.keys.node_queue(name)
        self.celery = make_celery(settings)
        root = Path(settings.workdir) if settings.workdir else Path(tempfile.gettempdir())
        self.workdir = root / f"actfleet-{name}"
        self.runtimes = Runtimes(self, capacity)
        self.approvals = Approvals(self)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="actfleet-loop")
        self._heartbeat: asyncio.Task[None] | None = None
        self.running: dict[asyncio.Future[None], str] = {}
        """The steps running on this node, with their session (for cancellation)."""
        self.redis: aioredis.Redis
        self.pool: KernelPool

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the node's loop from a task thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def cancel_running(self, session_id: str) -> None:
        """Stop this node's running steps of a cancelled session (model streams stop,
        cells are interrupted)."""
        for work, session in list(self.running.items()):
            if session == session_id:
                work.cancel()

    def send(self, kind: str, args: list[Any], queue: str) -> None:
        send_step(self.celery, kind, args, queue)

    def start(self) -> None:
        self._thread.start()
        try:
            self.call(self._start())
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            raise

    async def _start(self) -> None:
        _keep_environment_private()
        self.redis = aioredis.Redis.from_url(self.settings.redis_url)
        self.workdir.mkdir(parents=True, exist_ok=True)
        await self._claim_name()
        # A previous process under this name may have died holding agents: recover them.
        await self.recover(self.name, own=True)
        await self._beat()
        self.pool = KernelPool.from_settings(self.settings)
        await self.pool.start()
        await self.approvals.start()
        self._heartbeat = asyncio.ensure_future(self._heartbeat_loop())

    async def _claim_name(self) -> None:
        """Refuse to run beside a live node of the same name; a dead one's heartbeat is
        given its TTL to expire."""
        deadline = time.monotonic() + self.settings.lease_ttl + self.settings.heartbeat_interval
        while await self.redis.exists(self.keys.node(self.name)):
            if time.monotonic() > deadline:
                raise NodeNameTaken(
                    f"a node named {self.name!r} is running (its heartbeat is being renewed); "
                    "give this one another --name"
                )
            await asyncio.sleep(0.2)

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
        expiry = time.time() + self.settings.lease_ttl
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.node(self.name), self.boot, px=ttl)
            pipe.sadd(self.keys.nodes(), self.name)
            for key in self.runtimes.lease_keys():
                pipe.pexpire(key, ttl)
            for runtime in self.runtimes.table.values():
                if runtime.parent_agent:  # a subagent's slots are leases too
                    s, a = runtime.session_id, runtime.agent_id
                    pipe.zadd(self.keys.slots(s, runtime.parent_agent), {a: expiry}, xx=True)
                    pipe.zadd(self.keys.fleet_slots(), {f"{s}/{a}": expiry}, xx=True)
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
                for member in await self.redis.smembers(self.keys.pumps()):
                    session_id, parent, cap = text(member).split("|")
                    await start_children(self, session_id, parent, int(cap))
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
                    step_task(text(kind)),
                    [session_id, agent_id, turn_id, int(step_no)],
                    self.keys.shared_queue(),
                )
        await self._requeue(self.keys.node_queue(dead))
        await self.redis.delete(self.keys.node_agents(dead))
        if not own:
            await self.redis.srem(self.keys.nodes(), dead)

    async def _requeue(self, queue: str) -> None:
        """Move the messages waiting on a node's queue to the shared queue."""
        while await self.redis.lmove(queue, self.keys.shared_queue(), "RIGHT", "LEFT"):
            pass
