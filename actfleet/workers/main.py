"""`actfleet worker`: start a node in the foreground; SIGTERM drains it gracefully."""

from __future__ import annotations

import logging
import socket

from actfleet.broker.keys import SHARED_QUEUE, node_queue
from actfleet.broker.settings import Settings
from actfleet.workers.node import Node
from actfleet.workers.tasks import register


def run_worker(name: str, concurrency: int, kernels: int, loglevel: str = "INFO") -> int:
    """Run a node until it is told to stop; returns the exit code."""
    logging.basicConfig(level=loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    node = Node(name, settings, capacity=kernels)
    register(node.celery, node)
    node.start()
    logging.getLogger("actfleet.node").info(
        "node %s up: %d task slots, %d kernels at most, redis %s",
        name,
        concurrency,
        kernels,
        settings.redis_url.split("@")[-1],
    )
    worker = node.celery.Worker(
        hostname=f"{name}@{socket.gethostname()}",
        pool="threads",
        concurrency=concurrency,
        queues=[SHARED_QUEUE, node_queue(name)],
        loglevel=loglevel,
        without_mingle=True,
        without_gossip=True,
        quiet=True,
    )
    try:
        worker.start()
    finally:
        node.stop()
    return worker.exitcode or 0
