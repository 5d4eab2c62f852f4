"""A worker node: one asyncio loop thread that owns the kernels, model streams and Redis
connection; a heartbeat that renews the node's leases and runs the sweeps; recovery of
dead nodes' work.

Celery tasks run in pool threads and hand their coroutines to the loop with `call`.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from actfleet.broker.celery_app import make_celery, send_step
from actfleet.broker.connection import async_redis
from actfleet.broker.keys import Keys
from actfleet.broker.records import CURRENT_STEP, AgentRecord, BadRecord, StepRef, running_step
from actfleet.broker.settings import Settings
from actfleet.broker.transitions import lease_holder, text
from actfleet.workers import batch_items, sweeps
from actfleet.workers.admission import Admission
from actfleet.workers.approvals import Approvals
from actfleet.workers.context import NodeContext
from actfleet.workers.kernel_pool import KernelPool
from actfleet.workers.mcp_config import load_mcp_config
from actfleet.workers.mcp_servers import McpServers
from actfleet.workers.runtimes import Runtimes
from actfleet.workers.steps import Steps

log = logging.getLogger("actfleet.node")
T = TypeVar("T")


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


class Node:
    """One `actfleet worker` process."""

    def __init__(self, name: str, settings: Settings, capacity: int):
        self.name = name
        self.settings = settings
        self.capacity = capacity
        self.keys = Keys(settings.key_prefix)
        self.celery = make_celery(settings)
        root = Path(settings.workdir) if settings.workdir else Path(tempfile.gettempdir())
        self.workdir = root / f"actfleet-{name}"
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="actfleet-loop")
        self._heartbeat: asyncio.Task[None] | None = None
        self._failing: set[str] = set()
        self.mcp = McpServers(load_mcp_config(settings.mcp_config))
        self.ctx: NodeContext
        self.runtimes: Runtimes
        self.admission: Admission
        self.approvals: Approvals
        self.steps: Steps

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the node's loop from a task thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def publish(self, ref: StepRef, queue: str) -> None:
        send_step(self.celery, ref, queue)

    # ---- start ----------------------------------------------------------------------

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
        redis = async_redis(self.settings)
        await redis.ping()
        boot = uuid.uuid4().hex[:12]
        self.ctx = NodeContext(self.name, boot, self.settings, redis, self.publish, self.mcp)
        self.workdir.mkdir(parents=True, exist_ok=True)
        await self._claim_name()
        # Clients check a submission's tools against the names the live nodes publish.
        await redis.hset(self.keys.mcp_servers(), self.name, json.dumps(self.mcp.names))
        pool = KernelPool.from_settings(self.settings, root=self.workdir / ".kernels")
        self.runtimes = Runtimes(self.ctx, pool, self.workdir, self.capacity)
        self.admission = Admission(self.ctx, self.runtimes)
        self.approvals = Approvals(
            self.ctx,
            on_cancel=lambda s: self.steps.cancel_session(s),
            on_admit=self.admission.admit,
        )
        self.steps = Steps(self.ctx, self.runtimes, self.approvals, self.admission)
        # A previous process under this name may have died holding agents: recover them.
        await self.recover(self.name, own=True)
        await self._beat()
        await pool.start()
        await self.approvals.start()
        await self.admission.admit()
        self._heartbeat = asyncio.ensure_future(self._heartbeat_loop())

    async def _claim_name(self) -> None:
        """Refuse to run beside a live node of the same name: at once when its heartbeat's
        TTL is seen renewed (within about one heartbeat interval); a dead one's heartbeat is
        given its TTL to expire."""
        deadline = time.monotonic() + self.settings.lease_ttl + self.settings.heartbeat_interval
        key, last = self.keys.node(self.name), None
        while (ttl := await self.ctx.redis.pttl(key)) != -2:
            if (last is not None and ttl > last) or time.monotonic() > deadline:
                raise NodeNameTaken(
                    f"a node named {self.name!r} is running (its heartbeat is being renewed); "
                    "give this one another --name"
                )
            last = ttl
            await asyncio.sleep(0.2)

    # ---- heartbeat ------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        """Each job fails on its own: a failing one is logged once (until it recovers) and
        never stops the others."""
        jobs: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("beat", self._beat),
            ("takeover", self._take_over_dead_nodes),
            ("reap", self.runtimes.reap_idle),
            ("admit", self.admission.admit),
            ("expire approvals", lambda: sweeps.expire_approvals(self.ctx, self.approvals)),
            ("redispatch", lambda: sweeps.redispatch(self.ctx, set(self.steps.running))),
            ("pump", lambda: sweeps.pump_children(self.ctx)),
            ("batches", lambda: batch_items.pump_all(self.ctx)),
            ("prune", lambda: sweeps.prune_sessions(self.ctx)),
        ]
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval)
            for name, job in jobs:
                try:
                    await job()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if name not in self._failing:
                        self._failing.add(name)
                        log.warning("heartbeat job %s failed (%s); retrying each beat", name, exc)
                else:
                    self._failing.discard(name)

    async def _beat(self) -> None:
        ctx = self.ctx
        ttl = int(self.settings.lease_ttl * 1000)
        expiry = time.time() + self.settings.lease_ttl
        table = self.runtimes.table.values()
        info = {
            "boot": ctx.boot,
            "capacity": self.capacity,
            "runtimes": len(table),
            "kernels": sum(runtime.kernel is not None for runtime in table),
            "running": "\n".join(sorted(self.steps.running)),
            "beat": time.time(),
        }
        async with ctx.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.node(self.name), ctx.boot, px=ttl)
            pipe.hset(self.keys.node_info(self.name), mapping=info)
            pipe.pexpire(self.keys.node_info(self.name), ttl)
            pipe.sadd(self.keys.nodes(), self.name)
            for key in self.runtimes.lease_keys():
                pipe.pexpire(key, ttl)
            for runtime in self.runtimes.table.values():
                if runtime.parent_agent:  # a subagent's slots are leases too
                    s, a = runtime.session_id, runtime.agent_id
                    pipe.zadd(self.keys.slots(s, runtime.parent_agent), {a: expiry}, xx=True)
                    pipe.zadd(self.keys.fleet_slots(), {f"{s}/{a}": expiry}, xx=True)
            await pipe.execute()

    async def _take_over_dead_nodes(self) -> None:
        for member in await self.ctx.redis.smembers(self.keys.nodes()):
            try:
                name = member.decode()
            except UnicodeDecodeError as exc:  # junk: it would stop every takeover
                if await self.ctx.redis.srem(self.keys.nodes(), member):
                    await self.ctx.dead_letter(self.keys.nodes(), member, f"not a node name: {exc}")
                continue
            if name != self.name and not await self.ctx.redis.exists(self.keys.node(name)):
                await self.recover(name)

    async def recover(self, dead: str, *, own: bool = False) -> None:
        """Take over a dead node's work: its agents' current steps go back to the shared
        queue (a step it had started is reported as interrupted, never re-run)."""
        redis, keys = self.ctx.redis, self.keys
        ttl = int(self.settings.lease_ttl * 1000)
        if not own and not await redis.set(keys.takeover(dead), self.name, nx=True, px=ttl):
            return
        for member in await redis.smembers(keys.node_agents(dead)):
            try:
                session_id, agent_id = text(member).split("/", 1)
                await self._recover_agent(dead, session_id, agent_id)
            except (ValueError, BadRecord) as exc:
                log.warning("skipping agent %r of node %s: %s", text(member)[:100], dead, exc)
        await self._requeue(keys.node_queue(dead))
        await redis.delete(keys.node_agents(dead))
        if not own:
            await redis.srem(keys.nodes(), dead)

    async def _recover_agent(self, dead: str, session_id: str, agent_id: str) -> None:
        redis, keys = self.ctx.redis, self.keys
        lease = keys.lease(session_id, agent_id)
        if lease_holder(await redis.get(lease)) == dead:
            await redis.delete(lease)
        turn_id = text(
            await redis.hget(keys.agent(session_id, agent_id), AgentRecord.ACTIVE_TURN) or ""
        )
        values = await redis.hmget(keys.turn(turn_id), *CURRENT_STEP) if turn_id else [None] * 3
        ref = running_step(session_id, agent_id, turn_id, values)
        if ref is None:
            return
        log.warning("recovering %s from node %s", ref.encode(), dead)
        self.publish(ref, keys.shared_queue())

    async def _requeue(self, queue: str) -> None:
        """Move the messages waiting on a node's queue to the shared queue."""
        while await self.ctx.redis.lmove(queue, self.keys.shared_queue(), "RIGHT", "LEFT"):
            pass

    # ---- stop -----------------------------------------------------------------------

    def stop(self) -> None:
        """Release every runtime, hand queued work back to the shared queue, stop. A Redis
        that does not answer is retried (see broker/connection.py), then given up on:
        what could not be released expires with its lease."""
        try:
            self.call(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    async def _stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await self.approvals.close()
        for what, job in (
            ("releasing runtimes", self.runtimes.close),
            ("requeueing this node's queue", lambda: self._requeue(self.ctx.queue)),
            ("stopping kernels", self.runtimes.pool.close),
            ("stopping MCP servers", self.mcp.close),
            ("unregistering", self._unregister),
        ):
            try:
                await job()
            except Exception as exc:
                log.warning("drain: %s failed (%s); its leases will expire", what, exc)
        await self.ctx.redis.aclose()

    async def _unregister(self) -> None:
        await self.ctx.redis.srem(self.keys.nodes(), self.name)
        await self.ctx.redis.hdel(self.keys.mcp_servers(), self.name)
        await self.ctx.redis.delete(self.keys.node(self.name), self.keys.node_info(self.name))
