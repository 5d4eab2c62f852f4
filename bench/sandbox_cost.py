"""What the kernels' sandbox costs: cold start, warm-pool acquire and a warm trivial cell,
with and without bubblewrap (targets: warm cell within 1.1x, cold start at most +100 ms).

    .venv/bin/python bench/sandbox_cost.py [--starts 10] [--cells 300]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from actfleet.broker.settings import Settings
from actfleet.workers.kernel import Kernel
from actfleet.workers.kernel_pool import KernelPool
from actfleet.workers.sandbox import Sandbox, check_available


async def measure(settings: Settings, root: Path, starts: int, cells: int) -> dict[str, list]:
    """Milliseconds of each cold start, warm acquire and warm `x = 1` cell."""
    found: dict[str, list[float]] = {"cold start": [], "warm acquire": [], "warm cell": []}
    for i in range(starts):
        begin = time.perf_counter()
        kernel = await Kernel.start(root / f"cold-{i}", settings=settings)
        found["cold start"].append((time.perf_counter() - begin) * 1000)
        await kernel.shutdown()
    async with KernelPool.from_settings(replace(settings, warm_kernels=1), root=root) as pool:
        for i in range(starts):
            await _until_warm(pool)
            begin = time.perf_counter()
            kernel = await pool.acquire(root / f"warm-{i}")
            found["warm acquire"].append((time.perf_counter() - begin) * 1000)
            if i == 0:
                for _ in range(cells + 20):
                    begin = time.perf_counter()
                    result = await kernel.execute("x = 1")
                    found["warm cell"].append((time.perf_counter() - begin) * 1000)
                    assert result.status == "ok", result.text
                del found["warm cell"][:20]  # warm-up
            await kernel.shutdown()
    return found


async def _until_warm(pool: KernelPool) -> None:
    while not pool._ready:  # noqa: SLF001 - a benchmark may look inside
        await asyncio.sleep(0.02)


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


async def main(starts: int, cells: int) -> None:
    base = Settings.from_env()
    check_available(Sandbox.from_settings(base))
    root = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    try:
        results = {
            "no sandbox": await measure(replace(base, sandbox=False), root / "off", starts, cells),
            "sandbox": await measure(replace(base, sandbox=True), root / "on", starts, cells),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{starts} cold starts, {starts} warm acquires, {cells} warm `x = 1` cells; ms")
    print(f"{'':<14}{'':<14}{'p50':>8}{'p95':>8}")
    for what in ("cold start", "warm acquire", "warm cell"):
        for mode, found in results.items():
            values = found[what]
            print(f"{what:<14}{mode:<14}{pct(values, 50):>8.2f}{pct(values, 95):>8.2f}")
    for what in ("cold start", "warm acquire", "warm cell"):
        on, off = pct(results["sandbox"][what], 50), pct(results["no sandbox"][what], 50)
        print(f"{what}: sandbox {on / off:.2f}x, {on - off:+.1f} ms (p50)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--cells", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(main(args.starts, args.cells))
