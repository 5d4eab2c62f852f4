"""Flower started as docker-compose.yml starts it (`celery -A actfleet.broker.flower_app
flower`) talks msgpack with real nodes and lists a finished turn's tasks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from actfleet.client import Client
from tests.conftest import wait_for, write_replay

pytest.importorskip("flower", reason="Flower is the optional extra actfleet[flower]")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_flower_with_the_app_inspects_nodes_and_lists_a_turns_tasks(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("n1")
    env = {**os.environ, "ACTFLEET_REDIS_URL": redis_url, "FLOWER_UNAUTHENTICATED_API": "1"}
    celery = [sys.executable, "-m", "celery", "-A", "actfleet.broker.flower_app"]
    ping = subprocess.run(
        [*celery, "inspect", "ping", "--timeout", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ping.returncode == 0 and "pong" in ping.stdout, ping.stdout + ping.stderr

    port = _free_port()
    log = open(tmp_path / "flower.log", "wb")  # noqa: SIM115 - lives with the process
    flower = subprocess.Popen(
        [*celery, "flower", f"--port={port}", "--address=127.0.0.1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def node_listed() -> bool:
            try:
                workers = httpx.get(f"{base}/api/workers", params={"refresh": 1}, timeout=10)
            except httpx.HTTPError:
                return False
            return any(name.startswith("n1@") for name in workers.json())

        wait_for(node_listed, 60, "Flower to list node n1 (its inspect answered)")
        enabled = "Events of group {task} enabled by remote"
        wait_for(lambda: enabled in fleet.log("n1"), 30, "Flower to enable the node's task events")
        replay = write_replay(tmp_path / "r.jsonl", {"code": "print(6 * 7)"}, {"text": "42"})
        client = Client(redis_url)
        handle = client.submit("compute", model=f"replay:{replay}", approval="auto")
        assert client.wait(handle, timeout=60).status == "finished"

        def turn_tasks() -> list[dict]:
            tasks = httpx.get(f"{base}/api/tasks", timeout=10).json().values()
            return [t for t in tasks if handle.session_id in str(t.get("args"))]

        tasks = wait_for(turn_tasks, 30, "Flower to list the turn's tasks")
        names = {t["name"] for t in tasks}
        assert {"actfleet.model_step", "actfleet.execution_step"} <= names
        log_text = (tmp_path / "flower.log").read_text(errors="replace")
        node_log = fleet.log("n1")
        assert "ContentDisallowed" not in log_text + node_log
    finally:
        flower.terminate()
        flower.wait(30)
