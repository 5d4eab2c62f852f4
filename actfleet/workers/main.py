"""`actfleet worker`: start a node in the foreground; SIGTERM drains it gracefully."""

from __future__ import annotations

import logging
import socket
import sys

import redis

from actfleet.broker.settings import Settings, SettingsError
from actfleet.workers.node import Node, NodeNameTaken
from actfleet.workers.tasks import register


def run_worker(name: str, concurrency: int, kernels: int, loglevel: str = "INFO") -> int:
    """Run a node until it is told to stop; returns the exit code (3: bad configuration)."""
    logging.basicConfig(level=loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
        node = Node(name, settings, capacity=kernels)
        register(node.celery, node)
        node.start()
    except (SettingsError, NodeNameTaken) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except redis.RedisError as exc:
        print(
            f"error: cannot reach Redis at {_safe(settings.redis_url)} ({exc}); start "
            "redis-server there or point ACTFLEET_REDIS_URL at one",
            file=sys.stderr,
        )
        return 3
    logging.getLogger("actfleet.node").info(
        "node %s up: %d task slots, %d kernels at most, redis %s",
        name,
        concurrency,
        kernels,
        _safe(settings.redis_url),
    )
    worker = node.celery.Worker(
        hostname=f"{name}@{socket.gethostname()}",
        pool="threads",
        consumer_cls="actfleet.workers.consumer:Consumer",
        concurrency=concurrency,
        queues=[node.keys.shared_queue(), node.keys.node_queue(name)],
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


def _safe(url: str) -> str:
    """The URL without its password."""
    return url.split("@")[-1]
