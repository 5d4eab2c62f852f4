"""Real parts for the tests: a private redis-server on a free port (never the machine's
shared Redis), and real `actfleet worker` processes with real kernels."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from actfleet.client.local_redis import RedisServerMissing, private_redis

if TYPE_CHECKING:
    from actfleet.broker.events import Event
    from actfleet.client import Client
    from tests.openai_stub import OpenAIStub

ROOT = Path(__file__).resolve().parent.parent
ACTFLEET = [sys.executable, "-m", "actfleet"]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):  # noqa: ANN001
    """Poll a state-proving predicate until it holds; fail the test naming what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """A private redis-server for the whole run; yields its base URL (no db)."""
    try:
        with private_redis(databases=256) as url:
            yield url
    except RedisServerMissing as exc:
        pytest.fail(f"{exc}, or run the tests through scripts/test")


_next_db = iter(range(1, 256))


def new_db_url(redis_server: str) -> str:
    """The URL of a database of the private server that nothing else in the run uses: the
    one allocator of database numbers, for `redis_url` and for module-scoped fleets."""
    db = next(_next_db, None)
    if db is None:
        pytest.fail("all 255 databases of the private redis-server are taken; raise `databases`")
    return f"{redis_server}/{db}"


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """A Redis database of the private server no other test uses."""
    return new_db_url(redis_server)


class Fleet:
    """Worker nodes started as real `actfleet worker` processes."""

    def __init__(self, redis_url: str, workdir: Path, env: dict[str, str] | None = None):
        self.redis_url = redis_url
        self.redis = redis.Redis.from_url(redis_url)
        self.workdir = workdir
        self.env = {
            **os.environ,
            "ACTFLEET_REDIS_URL": redis_url,
            "ACTFLEET_LEASE_TTL": "3",
            "ACTFLEET_HEARTBEAT_INTERVAL": "0.5",
            "ACTFLEET_WARM_KERNELS": "1",
            "ACTFLEET_WORKDIR": str(workdir),
            **(env or {}),
        }
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives with the node
        self.nodes[name] = subprocess.Popen(
            [*ACTFLEET, "worker", "--name", name, *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        wait_for(lambda: self._ready(name), 60, f"node {name} to come up")

    def _ready(self, name: str) -> bool:
        proc = self.nodes[name]
        if proc.poll() is not None:
            pytest.fail(f"node {name} exited with {proc.returncode}:\n{self.log(name)}")
        return bool(self.redis.exists(f"actfleet:node:{name}"))

    def agent_file(self, session_id: str, name: str, agent_id: str = "main") -> Path:
        """A file in the agent's working directory, on whichever node holds it (kernels are
        sandboxed: the working directory is the only place a cell writes that a test sees)."""
        found = sorted(self.workdir.glob(f"*/{session_id}/{agent_id}/{name}"))
        return found[0] if found else self.workdir / "nowhere" / name

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")[-5000:]

    def kill(self, name: str) -> None:
        self.nodes[name].send_signal(signal.SIGKILL)
        self.nodes[name].wait(10)

    def stop(self) -> None:
        for proc in self.nodes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.nodes.items():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
                print(f"node {name} did not stop on SIGTERM:\n{self.log(name)}")


@contextmanager
def provider_fleet(
    redis_server: str, workdir: Path, stub: OpenAIStub, name: str, env: dict[str, str] | None = None
) -> Iterator[Fleet]:
    """One node (4 task slots) on a database of its own, its model provider the local
    OpenAI stub."""
    fleet = Fleet(
        new_db_url(redis_server),
        workdir,
        {"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "dummy-key", **(env or {})},
    )
    try:
        fleet.start(name, "--concurrency", "4")
        yield fleet
    finally:
        fleet.stop()


def events_of(client: Client, session_id: str) -> list[Event]:
    """Every event of the session so far."""
    return list(client.events(session_id, follow=False))


@pytest.fixture
def fleet_factory(tmp_path: Path) -> Iterator:
    """Start fleets on given Redis URLs; every node is stopped at the end of the test."""
    fleets: list[Fleet] = []

    def make(redis_url: str, env: dict[str, str] | None = None) -> Fleet:
        fleet = Fleet(redis_url, tmp_path / f"fleet-{len(fleets)}", env)
        fleet.workdir.mkdir()
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.stop()


def cli(
    redis_url: str,
    *args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the `actfleet` CLI as a user would."""
    return subprocess.run(
        [*ACTFLEET, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        env={**os.environ, "ACTFLEET_REDIS_URL": redis_url, "COLUMNS": "120", **(env or {})},
    )


def write_replay(path: Path, *lines: dict) -> Path:
    import json

    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path
