"""The runtimes a node holds, against a real Redis, with a stand-in kernel pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

from actfleet.broker.connection import async_redis
from actfleet.broker.settings import Settings
from actfleet.workers.context import NodeContext
from actfleet.workers.runtimes import Runtimes


class SlowKernel:
    """A kernel that takes a while to shut down, as a real one under load does."""

    async def shutdown(self) -> None:
        await asyncio.sleep(0.3)


class Pool:
    async def acquire(self, working_dir: Path, network: str = "") -> SlowKernel:
        assert working_dir.is_dir()
        return SlowKernel()


def test_a_step_arriving_while_its_agents_runtime_is_released_gets_a_whole_new_one(
    redis_url: str, tmp_path: Path
):
    """Found by the chaos suite: an idle runtime evicted between two steps of its turn, and
    the turn's next step arriving during the eviction, used to get a runtime whose working
    directory and lease the eviction then removed (the kernel could not start: the turn
    failed)."""

    async def main() -> None:
        settings = Settings(redis_url=redis_url)
        ctx = NodeContext("n1", "boot1", settings, async_redis(settings), lambda *_: None)
        runtimes = Runtimes(ctx, Pool(), tmp_path, capacity=4)  # type: ignore[arg-type]
        old = await runtimes.obtain("s", "main")
        assert not isinstance(old, str) and old is not None
        await runtimes.kernel(old)
        eviction = asyncio.ensure_future(runtimes.release(old, "it was evicted"))
        await asyncio.sleep(0.05)  # the eviction is stopping the kernel
        new = await runtimes.obtain("s", "main")
        await eviction
        assert not isinstance(new, str) and new is not None and new is not old
        assert new.workdir.is_dir()
        assert await ctx.redis.get(ctx.keys.lease("s", "main")) == b"n1|boot1"
        assert await ctx.redis.sismember(ctx.keys.node_agents("n1"), "s/main")
        assert "it was evicted" in new.notice
        await ctx.redis.aclose()

    asyncio.run(main())
