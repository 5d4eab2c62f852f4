"""Batches end to end: the `actfleet batch` CLI and SDK against real nodes and kernels."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from actfleet.broker.events import CodeExecutionOutput, TurnStarted
from actfleet.client import BatchFileError, Client
from tests.conftest import ACTFLEET, cli, new_db_url, wait_for, write_replay


def write_items(path: Path, count: int, **extra: object) -> Path:
    with path.open("w") as handle:
        for i in range(count):
            item = {"custom_id": f"item-{i}", "prompt": f"item {i}", "metadata": {"n": i}}
            handle.write(json.dumps({**item, **extra}) + "\n")
    return path


def one_cell(tmp_path: Path, code: str = "print(6 * 7)") -> Path:
    return write_replay(tmp_path / "one-cell.jsonl", {"code": code}, {"text": "42"})


def results_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_bad_batch_file_is_refused_naming_line_and_field_and_nothing_is_written(
    redis_url: str, tmp_path: Path
):
    replay = one_cell(tmp_path)
    cases = {
        '{"custom_id": "a", "prompt": "x"}\n{"custom_id": "a", "prompt": "y"}\n': (
            "line 2: field 'custom_id'"
        ),
        '{"custom_id": "a", "prompt": "x"}\n{"custom_id": "b"}\n': "line 2: field 'prompt'",
        '{"custom_id": "a", "prompt": "x"}\n{"custom_id": "b", "prompt": "y",}\n': (
            "line 2: not JSON"
        ),
        '{"custom_id": "a", "prompt": "x", "model": "nope:m"}\n': "line 1: field 'model'",
        '{"custom_id": "a", "prompt": "x", "approval": "rules.toml"}\n': (
            "line 1: field 'approval'"
        ),
        '{"custom_id": "a", "prompt": "x", "session_id": "a/b"}\n': ("line 1: field 'session_id'"),
    }
    for content, expected in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(content)
        proc = cli(redis_url, "batch", "submit", str(bad), "--model", f"replay:{replay}")
        assert proc.returncode == 3, proc.stderr
        assert expected in proc.stderr, proc.stderr
    assert redis.Redis.from_url(redis_url).keys("actfleet:*") == []
    with pytest.raises(BatchFileError, match="item 1|items line 1: field 'prompt'"):
        Client(redis_url).submit_batch([{"custom_id": "x"}], model=f"replay:{replay}", name="n")


def test_a_batch_runs_within_its_concurrency_and_writes_one_result_per_item(
    redis_server: str, fleet_factory, tmp_path: Path
):
    """25 items, --concurrency 5, one node with 8 kernels: all complete, never more than 5
    running (from the events' timestamps), one result line each with its metadata.
    The same command again submits nothing and writes nothing."""
    fleet = fleet_factory(new_db_url(redis_server))
    fleet.start("n1", "--kernels", "8")
    replay = one_cell(tmp_path)
    items = write_items(tmp_path / "items.jsonl", 25)
    out = tmp_path / "out.jsonl"
    args = ["batch", "run", str(items), "--model", f"replay:{replay}", "--concurrency", "5"]
    proc = cli(fleet.redis_url, *args, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "25/25 ended (25 completed)" in proc.stderr
    results = results_of(out)
    assert sorted(r["custom_id"] for r in results) == sorted(f"item-{i}" for i in range(25))
    assert all(r["status"] == "completed" and r["response"] == "42" for r in results)
    assert all(r["metadata"] == {"n": int(r["custom_id"][5:])} for r in results)

    client = Client(fleet.redis_url)
    spans = []
    for result in results:
        events = list(client.events(result["session_id"], follow=False))
        assert [e.text for e in events if isinstance(e, CodeExecutionOutput)] == ["42\n"]
        spans.append((events[0].ts, events[-1].ts))
    assert max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans) <= 5

    again = cli(fleet.redis_url, *args, "-o", str(out))
    assert again.returncode == 0, again.stderr
    assert "0 new results" in again.stderr
    assert len(results_of(out)) == 25
    assert len(client.sessions(limit=100)) == 25


def test_killing_the_client_mid_submission_and_mid_follow_loses_and_repeats_nothing(
    redis_server: str, fleet_factory, tmp_path: Path
):
    """1,000 replayed items (an answer each) through 2 nodes; the client is SIGKILLed while
    it submits and again while it follows; the same command run again finishes the batch:
    1,000 result lines, one per custom_id, every item's turn started once."""
    fleet = fleet_factory(new_db_url(redis_server))
    fleet.start("n1")
    fleet.start("n2")
    replay = write_replay(tmp_path / "answer.jsonl", {"text": "42"})
    items = write_items(tmp_path / "items.jsonl", 1000)
    out = tmp_path / "out.jsonl"
    command = [*ACTFLEET, "batch", "run", str(items), "--model", f"replay:{replay}", "-o", str(out)]
    env = {**os.environ, "ACTFLEET_REDIS_URL": fleet.redis_url}
    store = redis.Redis.from_url(fleet.redis_url)

    def run_until(condition, what: str) -> None:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for(condition, 60, what, interval=0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    run_until(lambda: 0 < store.hlen("actfleet:batchitems:b-items") < 1000, "a first chunk")
    run_until(lambda: out.exists() and len(out.read_bytes().splitlines()) >= 100, "100 results")
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr

    results = results_of(out)
    assert len(results) == 1000
    assert len({r["custom_id"] for r in results}) == 1000
    assert {r["status"] for r in results} == {"completed"}
    assert store.hlen("actfleet:batchitems:b-items") == 1000
    client = Client(fleet.redis_url)
    for result in results[::50]:
        events = list(client.events(result["session_id"], follow=False))
        assert sum(isinstance(e, TurnStarted) for e in events) == 1


def test_a_node_killed_mid_batch_loses_no_item_and_runs_no_cell_twice(
    redis_server: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(new_db_url(redis_server), {"ACTFLEET_KEEP_WORKDIRS": "1"})
    fleet.start("n1", "--kernels", "4")
    fleet.start("n2", "--kernels", "4")
    code = "import time\nopen('mark.txt', 'a').write('ran\\n')\ntime.sleep(0.5)\nprint(42)"
    replay = one_cell(tmp_path, code)
    client = Client(fleet.redis_url)
    batch = client.submit_batch(
        write_items(tmp_path / "items.jsonl", 40), model=f"replay:{replay}", concurrency=8
    )
    wait_for(lambda: batch.progress().record.ended >= 8, 60, "8 items to end")
    fleet.kill("n1")
    progress = batch.wait(timeout=120)
    assert progress.record.ended == 40
    results = [r for _, r in batch.results()]
    assert sorted(r["custom_id"] for r in results) == sorted(f"item-{i}" for i in range(40))
    assert {r["status"] for r in results} == {"completed"}
    moved = 0
    for result in results:
        marks = sorted(fleet.workdir.glob(f"*/{result['session_id']}/main/mark.txt"))
        assert sum(len(m.read_text().splitlines()) for m in marks) <= 1, result
        nodes = {e.node for e in client.events(result["session_id"], follow=False) if e.node}
        moved += nodes == {"n1", "n2"}
    assert moved, "no item was running on the killed node"


def test_parked_items_hold_no_slot_and_are_approved_in_bulk(
    redis_server: str, fleet_factory, tmp_path: Path
):
    """Under `ask`, 4 items with --concurrency 2 all park for their cell's approval (a
    parked item frees its slot); `actfleet approve --all --batch B` runs them all."""
    fleet = fleet_factory(new_db_url(redis_server))
    fleet.start("n1", "--kernels", "4")
    replay = one_cell(tmp_path)
    client = Client(fleet.redis_url)
    batch = client.submit_batch(
        write_items(tmp_path / "ask.jsonl", 4),
        model=f"replay:{replay}",
        concurrency=2,
        approval="ask",
    )
    wait_for(lambda: batch.progress().parked == 4, 60, "4 items parked")
    assert batch.progress().queued == 0
    status = json.loads(cli(fleet.redis_url, "batch", "status", batch.id, "--json").stdout)
    assert status["waiting_for_approval"] == 4 and status["running"] == 0
    proc = cli(fleet.redis_url, "approve", "--all", "--batch", batch.id, "--kind", "code")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("approved") == 4
    assert batch.wait(timeout=60).record.counts["completed"] == 4


def test_an_item_budget_ends_each_item_after_the_step_that_spent_it(
    redis_server: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(new_db_url(redis_server))
    fleet.start("n1", "--kernels", "2")
    items = write_items(tmp_path / "tight.jsonl", 3)
    args = ["batch", "run", str(items), "-m", f"replay:{one_cell(tmp_path)}"]
    proc = cli(fleet.redis_url, *args, "--item-max-tokens", "1", "-o", str(tmp_path / "o.jsonl"))
    assert proc.returncode == 4, proc.stderr
    results = results_of(tmp_path / "o.jsonl")
    assert {r["status"] for r in results} == {"budget"} and len(results) == 3
    assert all(r["usage"]["requests"] == 1 for r in results)
