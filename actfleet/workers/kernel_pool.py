"""A node's kernels: a warm pool of fresh kernel processes, started a few at a time.

A cold kernel takes ~0.6 s to come up and a 2-core machine cannot start many at once
(DESIGN §7), so a node keeps `warm` processes started ahead of demand and starts at most
`start_concurrency` at a time. Kernels acquired from the pool also take their restarts from it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path

from actfleet.broker.settings import Settings
from actfleet.broker.settings import settings as current_settings
from actfleet.workers.kernel import (
    Kernel,
    KernelClosedError,
    KernelProcess,
    KernelStartError,
    kernel_env,
)
from actfleet.workers.sandbox import Sandbox

__all__ = ("KernelPool",)

logger = logging.getLogger(__name__)


class KernelPool:
    """Hands out fresh kernels, keeping `warm` processes started in the background.

    Everything runs on the event loop that calls it (the node's loop thread).
    """

    def __init__(
        self,
        warm: int,
        start_concurrency: int,
        *,
        start_timeout: float = 60.0,
        settings: Settings | None = None,
        env: Mapping[str, str] | None = None,
        root: Path | None = None,
    ) -> None:
        """`start_timeout` bounds each start once it has its turn; `settings` gives the
        kernels' cell limits and sandbox; `env` is added to every kernel's (scrubbed)
        environment; kernels' directories go in `root` (default: the temp dir), which must
        be on the working directories' filesystem."""
        self._warm = warm
        self._start_timeout = start_timeout
        self._settings = settings or current_settings()
        self._env = kernel_env(env)
        self._sandbox = Sandbox.of(self._settings)
        self._root = root
        self._turns = asyncio.Semaphore(start_concurrency)
        self._ready: deque[KernelProcess] = deque()
        self._waiters: deque[asyncio.Future[KernelProcess]] = deque()
        self._launching = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._kernels: set[Kernel] = set()
        self._closed = False

    @classmethod
    def from_settings(
        cls,
        settings: Settings | None = None,
        *,
        env: Mapping[str, str] | None = None,
        root: Path | None = None,
    ) -> KernelPool:
        settings = settings or current_settings()
        return cls(
            settings.warm_kernels,
            settings.kernel_start_concurrency,
            start_timeout=settings.kernel_start_timeout,
            settings=settings,
            env=env,
            root=root,
        )

    async def __aenter__(self) -> KernelPool:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Begin warming kernels in the background (returns at once)."""
        self._top_up()

    async def acquire(self, working_dir: Path | str, network: str = "") -> Kernel:
        """A fresh kernel working in `working_dir`. With a `network` other than the pool's
        ("none" for a session that asked for it) the kernel and its restarts are started
        for it, not taken warm."""
        self._check_open()
        launcher: Callable[[], Awaitable[KernelProcess]] = self._process
        if network and (self._sandbox is None or network != self._sandbox.network):
            if self._sandbox is None:
                raise KernelStartError(
                    f"the session asked for kernel network {network!r}, but this node runs "
                    "kernels without a sandbox (--no-sandbox) and cannot confine them"
                )
            launcher = partial(self._launch, replace(self._sandbox, network=network))
        kernel = await Kernel.start(working_dir, settings=self._settings, launcher=launcher)
        if self._closed:
            await kernel.shutdown()
            self._check_open()
        self._kernels = {k for k in self._kernels if not k.closed}
        self._kernels.add(kernel)
        return kernel

    async def close(self) -> None:
        """Shut down every kernel handed out and every warm process."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(KernelClosedError("kernel pool was closed"))
        self._waiters.clear()
        await asyncio.gather(
            *(kernel.shutdown() for kernel in self._kernels),
            *(process.close() for process in self._ready),
        )
        self._kernels.clear()
        self._ready.clear()

    async def _process(self) -> KernelProcess:
        """A warm process if one is ready, else the next one to come up."""
        self._check_open()
        while self._ready:
            process = self._ready.popleft()
            if await process.alive():
                self._top_up()
                return process
            await process.close()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._top_up()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif not waiter.cancelled() and waiter.exception() is None:
                self._ready.append(waiter.result())  # handed over just as we were cancelled
            raise

    def _top_up(self) -> None:
        """Start enough processes for every waiter plus `warm` spare ones."""
        missing = self._warm + len(self._waiters) - len(self._ready) - self._launching
        for _ in range(missing if not self._closed else 0):
            self._launching += 1
            task = asyncio.create_task(self._start_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _launch(self, sandbox: Sandbox | None) -> KernelProcess:
        """Start one process, in turn with the other starts."""
        async with self._turns:
            began = time.monotonic()
            process = await KernelProcess.launch(
                self._env, timeout=self._start_timeout, sandbox=sandbox, root=self._root
            )
            logger.info("kernel started in %.0f ms", (time.monotonic() - began) * 1000)
            return process

    async def _start_one(self) -> None:
        try:
            process = await self._launch(self._sandbox)
        except Exception as error:
            # Fail one waiter rather than retrying a start that may keep failing.
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(error)
                    return
            logger.warning("warm kernel failed to start", exc_info=True)
            return
        finally:
            self._launching -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(process)
                return
        self._ready.append(process)

    def _check_open(self) -> None:
        if self._closed:
            raise KernelClosedError("kernel pool was closed")
