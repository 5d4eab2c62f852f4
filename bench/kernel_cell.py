"""Warm trivial-cell latency: actfleet's kernel layer beside raw jupyter_client.

Runs `x = 1` N times on a `Kernel` and on a second kernel driven by bare jupyter_client
(execute, then wait for idle), same IPC transport, runs interleaved so drift hits both.

    .venv/bin/python bench/kernel_cell.py [--runs 500]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

from actfleet.workers.kernel import Kernel, kernel_env

CODE = "x = 1"


async def raw_cell(client: AsyncKernelClient) -> None:
    msg_id = client.execute(CODE)
    while True:
        msg = await client.get_iopub_msg()
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            return


async def main(runs: int, warmup: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-kernel-"))
    kernel = await Kernel.start(workdir / "work")
    manager = AsyncKernelManager(
        transport="ipc", connection_file=str(workdir / "raw.json"), ip=str(workdir / "raw-ipc")
    )
    await manager.start_kernel(env=kernel_env())
    client = manager.client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    try:
        layer: list[float] = []
        raw: list[float] = []
        for i in range(warmup + runs):
            start = time.perf_counter()
            result = await kernel.execute(CODE)
            middle = time.perf_counter()
            await raw_cell(client)
            end = time.perf_counter()
            assert result.status == "ok", result.text
            if i >= warmup:
                layer.append((middle - start) * 1000)
                raw.append((end - middle) * 1000)
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)
        await kernel.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)

    def pct(values: list[float], q: int) -> float:
        return statistics.quantiles(values, n=100)[q - 1]

    print(f"warm `{CODE}` cell, {runs} runs each (after {warmup} warm-up), ms")
    print(f"{'':<22}{'p50':>8}{'p99':>8}")
    print(f"{'actfleet Kernel':<22}{pct(layer, 50):>8.2f}{pct(layer, 99):>8.2f}")
    print(f"{'raw jupyter_client':<22}{pct(raw, 50):>8.2f}{pct(raw, 99):>8.2f}")
    p50, p99 = pct(layer, 50) / pct(raw, 50), pct(layer, 99) / pct(raw, 99)
    print(f"ratio (actfleet / raw): p50 {p50:.2f}x, p99 {p99:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.warmup))
