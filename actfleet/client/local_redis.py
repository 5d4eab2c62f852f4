"""A private redis-server on a free loopback port, for the demo and the tests: never the
machine's shared Redis, and gone when the block ends."""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis


class RedisServerMissing(RuntimeError):
    """redis-server is not on PATH."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def private_redis(databases: int = 16, *, password: bool = True) -> Iterator[str]:
    """Start redis-server (no persistence) on a free port, with a fresh password unless
    told not to (kernels must not be able to use it; docs/security.md); yields its URL,
    password included, without a db."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisServerMissing(
            "redis-server is not on PATH; install it (Debian: apt-get install -y redis-server)"
        )
    port = free_port()
    secret = secrets.token_urlsafe(24) if password else ""
    with tempfile.TemporaryDirectory(prefix="actfleet-redis-") as workdir:
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir,
                "--databases",
                str(databases),
                *(("--requirepass", secret) if secret else ()),
            ],
            stdout=subprocess.DEVNULL,
        )
        url = f"redis://:{secret}@127.0.0.1:{port}" if secret else f"redis://127.0.0.1:{port}"
        try:
            _wait_until_it_answers(proc, redis.Redis(port=port, password=secret or None))
            yield url
        finally:
            proc.terminate()
            proc.wait(10)


def _wait_until_it_answers(proc: subprocess.Popen[bytes], client: redis.Redis) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the private redis-server did not start") from None
            time.sleep(0.05)
