"""`actfleet worker`: start a node in the foreground; SIGTERM drains it gracefully."""

from __future__ import annotations

import logging
import socket
import sys
from dataclasses import replace

import redis

from actfleet.broker.connection import open_to_anyone
from actfleet.broker.settings import Settings, SettingsError
from actfleet.broker.shell_parse import shell_commands
from actfleet.workers.mcp_config import McpConfigError
from actfleet.workers.node import Node, NodeNameTaken
from actfleet.workers.sandbox import Sandbox, SandboxUnavailable, check_available
from actfleet.workers.tasks import register


def run_worker(
    name: str,
    concurrency: int,
    kernels: int,
    loglevel: str = "INFO",
    *,
    sandbox: bool = True,
    allow_open_redis: bool = False,
) -> int:
    """Run a node until it is told to stop; returns the exit code (3: bad configuration,
    a sandbox that cannot work here, or a Redis open to the kernels)."""
    logging.basicConfig(level=loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("actfleet.node")
    try:
        settings = Settings.from_env()
        if not sandbox:
            settings = replace(settings, sandbox=False)
        confinement = Sandbox.of(settings)
        if confinement is None:
            log.warning(
                "kernels run WITHOUT a sandbox (--no-sandbox): a session's code can read "
                "other sessions' files and signal the node (docs/security.md)"
            )
        else:
            check_available(confinement)
        if _kernels_reach_redis(confinement) and open_to_anyone(settings.redis_url):
            if not allow_open_redis:
                raise OpenRedis(
                    f"Redis at {_safe(settings.redis_url)} needs no password, and kernels have "
                    "network (ACTFLEET_KERNEL_NETWORK=full), so a session's code could forge "
                    "events, approve requests and enqueue work. Turn on authentication (a "
                    "requirepass or an ACL user, given in ACTFLEET_REDIS_URL), or set "
                    "ACTFLEET_KERNEL_NETWORK=none, or start the node with --allow-open-redis "
                    "(docs/security.md)"
                )
            log.warning(
                "Redis at %s needs no password and kernels have network: any session's "
                "code can reach it (--allow-open-redis; docs/security.md)",
                _safe(settings.redis_url),
            )
        shell_commands("true")  # loads bashlex now, not in the loop at the first `!cmd`
        node = Node(name, settings, capacity=kernels)
        register(node.celery, node)
        node.start()
    except (SettingsError, NodeNameTaken, SandboxUnavailable, OpenRedis, McpConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except redis.AuthenticationError as exc:
        print(
            f"error: Redis at {_safe(settings.redis_url)} refused the credentials ({exc}); give "
            "its password in ACTFLEET_REDIS_URL: redis://:PASSWORD@host:port/db",
            file=sys.stderr,
        )
        return 3
    except redis.RedisError as exc:
        print(
            f"error: cannot reach Redis at {_safe(settings.redis_url)} ({exc}); start "
            "redis-server there or point ACTFLEET_REDIS_URL at one",
            file=sys.stderr,
        )
        return 3
    log.info(
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


class OpenRedis(RuntimeError):
    """Redis needs no authentication while kernels can reach it."""


def _kernels_reach_redis(sandbox: Sandbox | None) -> bool:
    """Whether kernels have a network (unconfined kernels have the node's)."""
    return sandbox is None or sandbox.network != "none"


def _safe(url: str) -> str:
    """The URL without its password."""
    return url.split("@")[-1]
