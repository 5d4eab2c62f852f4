"""Batch throughput: N replayed items through 2 nodes; sessions/s, kernel births/s and
KernelRestarted events (evictions mid-turn: must be 0); and submission: items/s written
for a large batch file, and the client's peak memory.

Each item is one cell (`print(6 * 7)`) and an answer, or with --text-only just an answer
(no code: what an item costs when no kernel is used). Sessions/s is items over wall time
from `submit_batch` to the last result. Kernel births are counted from the nodes' logs.

    .venv/bin/python bench/batch_throughput.py [--items 1000] [--kernels 8] [--text-only]
    .venv/bin/python bench/batch_throughput.py --submit-only --items 10000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

from _fleet import Fleet

from actfleet.broker.events import KernelRestarted
from actfleet.client import Client


def write_files(directory: Path, items: int, text_only: bool) -> tuple[Path, Path]:
    replay = directory / "replay.jsonl"
    lines = [{"text": "42"}] if text_only else [{"code": "print(6 * 7)"}, {"text": "42"}]
    replay.write_text("".join(json.dumps(line) + "\n" for line in lines))
    batch = directory / "items.jsonl"
    with batch.open("w") as handle:
        for i in range(items):
            handle.write(json.dumps({"custom_id": f"item-{i}", "prompt": f"item {i}"}) + "\n")
    return replay, batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--kernels", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--text-only", action="store_true")
    parser.add_argument("--submit-only", action="store_true")
    args = parser.parse_args()

    fleet = Fleet(prefix="bench-batch-", deadline=1800)
    fleet.start_redis()
    replay, items = write_files(fleet.dir, args.items, args.text_only)
    client = Client(fleet.redis_url)
    if args.submit_only:
        started = time.perf_counter()
        batch = client.submit_batch(items, model=f"replay:{replay}", concurrency=1)
        elapsed = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rate = args.items / elapsed
        print(f"submitted {args.items} items in {elapsed:.2f} s: {rate:.0f} items/s")
        print(f"client peak RSS {peak:.0f} MiB; batch {batch.id} total {batch.record().total}")
        fleet.stop()
        return

    for name in ("n1", "n2"):
        fleet.start_worker(name, loglevel="INFO", warm_kernels=2)
    fleet.wait_warm("n1", 2)
    fleet.wait_warm("n2", 2)
    started = time.perf_counter()
    batch = client.submit_batch(
        items, model=f"replay:{replay}", concurrency=args.concurrency, name="bench"
    )
    progress = batch.wait(timeout=1500, poll=0.2)
    elapsed = time.perf_counter() - started
    results = [r for _, r in batch.results()]
    restarted = 0
    for result in results:
        events = client.events(result["session_id"], follow=False)
        restarted += sum(isinstance(e, KernelRestarted) for e in events)
    ticks = os.sysconf("SC_CLK_TCK")
    node_cpu = kernel_cpu = 0.0
    for name in ("n1", "n2"):
        stat = Path(f"/proc/{fleet.procs[name].pid}/stat").read_text().rsplit(")", 1)[1].split()
        node_cpu += (int(stat[11]) + int(stat[12])) / ticks
        kernel_cpu += (int(stat[13]) + int(stat[14])) / ticks
    births = sum(fleet.log_path(n).read_text().count("kernel started") for n in ("n1", "n2"))
    statuses = {s: n for s, n in progress.record.counts.items() if n}
    print(
        f"{len(results)} items ({'text only' if args.text_only else 'one cell each'}) on 2 nodes "
        f"x {args.kernels} kernels, concurrency {args.concurrency}: {elapsed:.1f} s, "
        f"{len(results) / elapsed:.2f} sessions/s; {statuses}; KernelRestarted {restarted}; "
        f"kernel births logged {births} ({births / elapsed:.2f}/s); CPU s: nodes "
        f"{node_cpu:.1f}, their ended children (kernels) {kernel_cpu:.1f}"
    )
    fleet.stop()


if __name__ == "__main__":
    main()
