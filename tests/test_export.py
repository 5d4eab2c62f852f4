"""`actfleet export`: a session written out as freeact stores sessions, from a real fleet."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import redis
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse

from actfleet.broker.keys import Keys
from actfleet.client import Client
from actfleet.client.export import SessionSnapshot, write_session
from actfleet.client.render import json_line
from tests.conftest import cli, write_replay


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def stored_history(redis_url: str, session_id: str, agent_id: str) -> list[bytes]:
    return redis.Redis.from_url(redis_url).lrange(Keys().history(session_id, agent_id), 0, -1)


def test_export_writes_one_freeact_file_per_agent_with_its_history_and_the_events(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("n1")
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"tool_calls": [{"name": "subagent_task", "args": {"prompt": "count"}}]},
        {"text": "the subagent counted"},
        {"agent": "sub", "code": "print(sum(range(10)))"},
        {"agent": "sub", "text": "45"},
    )
    client = Client(redis_url)
    handle = client.submit("delegate", model=f"replay:{replay}", approval="auto")
    assert client.wait(handle, timeout=90).response == "the subagent counted"
    session = handle.session_id
    out = tmp_path / "export"

    proc = cli(redis_url, "export", session, "-o", str(out))

    assert proc.returncode == 0, proc.stderr
    assert (out / "main.jsonl").exists()
    sub_files = list(out.glob("sub-*.jsonl"))
    assert len(sub_files) == 1
    for path in [out / "main.jsonl", *sub_files]:
        lines = lines_of(path)
        assert all(line["v"] == 1 and set(line) == {"v", "message", "meta"} for line in lines)
        assert all(line["meta"]["ts"].endswith("Z") for line in lines)
        stamps = [datetime.fromisoformat(line["meta"]["ts"]) for line in lines]
        assert stamps == sorted(stamps)
        messages = ModelMessagesTypeAdapter.validate_python([line["message"] for line in lines])
        history = stored_history(redis_url, session, path.stem)
        assert messages == ModelMessagesTypeAdapter.validate_json(b"[" + b",".join(history) + b"]")
        timed = zip(messages, stamps, strict=True)
        assert all(ts == m.timestamp for m, ts in timed if isinstance(m, ModelResponse))
    events = lines_of(out / "events.jsonl")
    assert events == [json.loads(json_line(e)) for e in client.events(session, follow=False)]
    main_types = [e["type"] for e in events if e["agent_id"] == "main"]
    sub_types = [e["type"] for e in events if e["agent_id"] == sub_files[0].stem]
    assert (main_types[0], main_types[-1]) == ("TurnStarted", "TurnFinished")
    assert sub_types[0] == "SubagentStarted"
    assert sub_types[-2:] == ["TurnFinished", "SubagentFinished"]


def test_export_of_an_unknown_session_exits_3_naming_it(redis_url: str, tmp_path: Path):
    proc = cli(redis_url, "export", "no-such-session", "-o", str(tmp_path / "out"))

    assert proc.returncode == 3
    assert "no-such-session" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_export_refuses_to_overwrite_an_earlier_export_unless_forced(
    redis_url: str, tmp_path: Path
):
    session = Client(redis_url).submit("no node runs it", model="openai:gpt-4o").session_id
    out = tmp_path / "out"
    assert cli(redis_url, "export", session, "-o", str(out)).returncode == 0
    (out / "events.jsonl").write_text("kept\n")

    refused = cli(redis_url, "export", session, "-o", str(out))

    assert refused.returncode == 3
    assert "events.jsonl" in refused.stderr and "--force" in refused.stderr
    assert (out / "events.jsonl").read_text() == "kept\n"
    assert cli(redis_url, "export", session, "-o", str(out), "--force").returncode == 0
    assert lines_of(out / "events.jsonl")[0]["type"] == "TurnStarted"


def test_meta_ts_is_the_messages_own_time_in_utc_or_the_export_time_when_it_has_none(
    tmp_path: Path,
):
    response = {"parts": [], "timestamp": "2026-01-02T03:04:05.000006+02:00", "kind": "response"}
    request = {"parts": [{"content": "hi", "timestamp": "2026-01-02T01:00:00"}], "kind": "request"}
    untimed = {"parts": [{"content": "hi"}], "timestamp": None, "kind": "request"}
    history = [json.dumps(m).encode() for m in (request, response, untimed)]
    before = datetime.now(UTC)

    write_session(SessionSnapshot("s", {"main": history}, []), tmp_path, force=False)

    lines = lines_of(tmp_path / "main.jsonl")
    assert [line["message"] for line in lines] == [request, response, untimed]
    assert [line["meta"]["ts"] for line in lines[:2]] == [
        "2026-01-02T01:00:00Z",
        "2026-01-02T01:04:05.000006Z",
    ]
    assert datetime.fromisoformat(lines[2]["meta"]["ts"]) >= before
