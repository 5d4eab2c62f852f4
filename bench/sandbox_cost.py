"""What the kernels' sandbox costs: cold start, warm-pool acquire and a warm trivial cell,
without bubblewrap, with it and a cgroup per kernel (where this machine allows one), and
with it and rlimits only (targets: warm cell within 1.1x, cold start at most +100 ms).

    .venv/bin/python bench/sandbox_cost.py [--starts 10] [--cells 300]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from _fleet import pct

from actfleet.broker.settings import Settings
from actfleet.workers.kernel import Kernel
from actfleet.workers.kernel_pool import KernelPool
from actfleet.workers.sandbox import Sandbox, check_available

MODES = ("no sandbox", "sandbox", "sandbox rlimits")


async def measure(base: Settings, root: Path, starts: int, cells: int) -> dict[str, dict]:
    """Milliseconds of each cold start, warm acquire and warm `x = 1` cell, per mode; the
    modes take turns sample by sample, so load on the machine hits both alike."""
    settings = {
        "no sandbox": replace(base, sandbox=False),
        "sandbox": replace(base, sandbox=True, kernel_cgroups=True),
        "sandbox rlimits": replace(base, sandbox=True, kernel_cgroups=False),
    }
    found: dict[str, dict[str, list[float]]] = {
        mode: {"cold start": [], "warm acquire": [], "warm cell": []} for mode in MODES
    }
    for i in range(starts):
        for mode in MODES:
            begin = time.perf_counter()
            kernel = await Kernel.start(root / f"cold-{i}-{mode}", settings=settings[mode])
            found[mode]["cold start"].append((time.perf_counter() - begin) * 1000)
            await kernel.shutdown()
    pools = {
        mode: KernelPool.from_settings(replace(settings[mode], warm_kernels=1), root=root)
        for mode in MODES
    }
    kernels: dict[str, Kernel] = {}
    try:
        for pool in pools.values():
            await pool.start()
        for i in range(starts):
            for mode, pool in pools.items():
                await _until_warm(pool)
                begin = time.perf_counter()
                kernel = await pool.acquire(root / f"warm-{i}-{mode}")
                found[mode]["warm acquire"].append((time.perf_counter() - begin) * 1000)
                if mode in kernels:
                    await kernel.shutdown()
                else:
                    kernels[mode] = kernel
        for i in range(cells + 20):
            for mode, kernel in kernels.items():
                begin = time.perf_counter()
                result = await kernel.execute("x = 1")
                if i >= 20:  # after a warm-up
                    found[mode]["warm cell"].append((time.perf_counter() - begin) * 1000)
                assert result.status == "ok", result.text
    finally:
        for pool in pools.values():
            await pool.close()
    return found


async def _until_warm(pool: KernelPool) -> None:
    while not pool._ready:  # noqa: SLF001 - a benchmark may look inside
        await asyncio.sleep(0.02)


async def main(starts: int, cells: int) -> None:
    base = Settings.from_env()
    sandbox = Sandbox.from_settings(replace(base, kernel_cgroups=True))
    check_available(sandbox)
    cgroups = sandbox.cgroups.describe() if sandbox.cgroups else "none here"
    root = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    try:
        results = await measure(base, root, starts, cells)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{starts} cold starts, {starts} warm acquires, {cells} warm `x = 1` cells; ms")
    print(f"kernel cgroups in mode 'sandbox': {cgroups}")
    print(f"{'':<14}{'':<17}{'p50':>8}{'p95':>8}")
    for what in ("cold start", "warm acquire", "warm cell"):
        for mode, found in results.items():
            values = found[what]
            print(f"{what:<14}{mode:<17}{pct(values, 50):>8.2f}{pct(values, 95):>8.2f}")
    for what in ("cold start", "warm acquire", "warm cell"):
        off = pct(results["no sandbox"][what], 50)
        for mode in MODES[1:]:
            on = pct(results[mode][what], 50)
            print(f"{what}: {mode} {on / off:.2f}x, {on - off:+.1f} ms (p50)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--cells", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(main(args.starts, args.cells))
