"""MCP tools with a real MCP stdio server (tests/mcp_server.py), real nodes and kernels:
JSON tool calls and programmatic calls from cells, both under the approval policy."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from actfleet.broker import events as ev
from actfleet.client import Client
from actfleet.client.demo import example_mcp_config
from actfleet.workers.mcp_codegen import modules, python_type, write_modules
from actfleet.workers.mcp_config import McpConfigError, load_mcp_config, parse_mcp_config
from actfleet.workers.mcp_servers import McpServers, McpTool
from tests.conftest import Fleet, cli, new_db_url, write_replay

SERVER = str(Path(__file__).with_name("mcp_server.py"))
KEY = ("s", "main")
SLOW_START = 20
"""Seconds the `slow` server sleeps before it serves (the default init timeout is 30 s)."""
MCP_MODULES = ("mcp_config", "mcp_servers", "mcp_codegen", "tool_calls")


@pytest.mark.parametrize("name", MCP_MODULES)
def test_each_mcp_module_imports(name: str):
    importlib.import_module(f"actfleet.workers.{name}")


def test_config_expands_variables_and_reads_both_transports():
    data = {
        "mcpServers": {
            "files": {
                "command": "${PY}",
                "args": ["-m", "srv", "--token=${TOKEN}"],
                "env": {"KEY": "${TOKEN}"},
                "exclude_tools": ["rm"],
                "scope": "runtime",
            },
            "web": {"url": "https://mcp.example/${PATH_PART}", "headers": {"A": "b ${TOKEN}"}},
        }
    }
    servers = parse_mcp_config(data, {"PY": "/usr/bin/python3", "TOKEN": "t0k", "PATH_PART": "x"})
    files, web = servers["files"], servers["web"]
    assert (files.transport, files.command, files.args) == (
        "stdio",
        "/usr/bin/python3",
        ("-m", "srv", "--token=t0k"),
    )
    assert (files.env, files.exclude_tools, files.scope) == ({"KEY": "t0k"}, {"rm"}, "runtime")
    assert (web.transport, web.url, web.headers) == (
        "http",
        "https://mcp.example/x",
        {"A": "b t0k"},
    )
    assert (web.scope, web.init_timeout) == ("node", 30.0)


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ({"command": "x", "args": ["${NOPE}"]}, r"mcpServers\.s\.args\[0\]: \$\{NOPE\} is not set"),
        ({"command": "x", "url": "http://h"}, "'command' does not apply to a http server"),
        ({"command": "x", "comand": "y"}, "unknown key 'comand'"),
        ({"args": []}, "a stdio server needs command"),
        ({"url": "http://h", "type": "sse"}, "SSE servers are not supported"),
        ({"command": "x", "scope": "cluster"}, "scope: 'cluster' is not node"),
        ({"command": "x", "init_timeout": 0}, "init_timeout: must be a positive number"),
    ],
)
def test_a_bad_server_entry_is_refused_naming_the_field(entry: dict, error: str):
    with pytest.raises(McpConfigError, match=error):
        parse_mcp_config({"mcpServers": {"s": entry}}, {})


def test_a_server_name_must_be_an_identifier():
    with pytest.raises(McpConfigError, match="server name must be a letter"):
        parse_mcp_config({"mcpServers": {"my-server": {"command": "x"}}}, {})


def test_generated_modules_have_typed_parameters_and_results(tmp_path: Path, monkeypatch):
    tool = McpTool(
        server="srv",
        name="find-items",
        description='Find items; """quoted""" \\ kept.',
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "default": 10},
                "from": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                "mode": {"enum": ["fast", "exact"]},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["query", "mode"],
        },
        output_schema={"type": "object", "properties": {"result": {"type": "boolean"}}},
    )
    write_modules(tmp_path, modules([tool]))
    (tmp_path / "mcptools" / "old").mkdir()
    write_modules(tmp_path, modules([tool]))  # a server no longer used is removed
    assert sorted(p.name for p in (tmp_path / "mcptools").iterdir()) == ["__init__.py", "srv"]
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("mcptools.srv.find_items")
    signature = inspect.signature(module.run)
    assert str(signature) == (
        "(query: 'str', mode: \"Literal['fast', 'exact']\", limit: 'int | None' = None, "
        "from_: 'float | None' = None, tags: 'list[str] | None' = None) -> 'bool'"
    )
    assert module.run.__doc__ == 'Find items; """quoted""" \\ kept.'
    assert python_type({"type": ["string", "null"]}) == "str | None"
    assert python_type({"$ref": "#/defs/x"}) == "Any"


def test_per_runtime_servers_are_one_process_per_runtime_stopped_with_it():
    config = {"command": sys.executable, "args": [SERVER], "scope": "runtime"}
    servers = McpServers(parse_mcp_config({"mcpServers": {"t": config}}, os.environ))

    async def pids() -> tuple[int, int, int]:
        try:
            calls = [servers.call("t", "pid", {}, (s, "main"), 30) for s in ("s1", "s2", "s1")]
            first, second, again = [r.structured["result"] for r in await asyncio.gather(*calls)]
            await servers.release_runtime(("s1", "main"))
            return first, second, again
        finally:
            await servers.close()

    first, second, again = asyncio.run(pids())
    assert first == again and first != second
    assert not Path(f"/proc/{first}").exists()  # stopped with its runtime


def test_the_example_server_converts_units_as_the_demo_configures_it(tmp_path: Path):
    servers = McpServers(load_mcp_config(str(example_mcp_config(tmp_path))))

    async def use() -> tuple[list[str], float, str]:
        try:
            names = [tool.name for tool in await servers.tools("units", KEY)]
            marathon = await servers.call(
                "units", "convert", {"value": 26.2, "from_unit": "mi", "to_unit": "km"}, KEY, 30
            )
            mixed = await servers.call(
                "units", "convert", {"value": 1, "from_unit": "kg", "to_unit": "km"}, KEY, 30
            )
            return names, marathon.structured["result"], mixed.text
        finally:
            await servers.close()

    names, marathon, mixed = asyncio.run(use())
    assert names == ["list_units", "convert"]
    assert marathon == 42.164813
    assert "cannot convert mass (kg) to length (km)" in mixed


# ---- end to end: a fleet whose node configures the test server ---------------------


@pytest.fixture(scope="module")
def fleet(redis_server: str, tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("mcp-fleet")
    config = {
        "mcpServers": {
            "t": {"command": sys.executable, "args": [SERVER], "exclude_tools": ["secret"]},
            "broken": {
                "command": sys.executable,
                "args": [SERVER],
                "env": {"MCP_TEST_FAIL": "1"},
            },
            "slow": {
                "command": sys.executable,
                "args": [SERVER],
                "env": {"MCP_TEST_INIT_DELAY": str(SLOW_START)},
            },
        }
    }
    (workdir / "mcp.json").write_text(json.dumps(config))
    fleet = Fleet(
        new_db_url(redis_server),
        workdir,
        {"ACTFLEET_MCP_CONFIG": str(workdir / "mcp.json"), "ACTFLEET_OUTPUT_CAP": "2000"},
    )
    try:
        fleet.start("mcp1")
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def client(fleet: Fleet) -> Client:
    return Client(fleet.redis_url)


def rules(tmp_path: Path, text: str) -> str:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return str(path)


def next_event(events, cls: type) -> ev.Event:
    for event in events:
        if isinstance(event, cls):
            return event
    raise AssertionError("stream ended")


def tool_returns(fleet: Fleet, session_id: str) -> dict[str, str]:
    """Tool name -> the content the model was given, from the agent's history."""
    returns = {}
    for raw in fleet.redis.lrange(f"actfleet:history:{session_id}:main", 0, -1):
        for part in json.loads(raw).get("parts", []):
            if part.get("part_kind") == "tool-return":
                returns[part["tool_name"]] = part["content"]
    return returns


def test_json_tool_calls_reach_the_server_and_the_policy_asks_for_kind_tool(
    fleet: Fleet, client: Client, tmp_path: Path
):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {
            "tool_calls": [
                {"name": "t_add", "args": {"a": 2, "b": 3}},
                {"name": "t_fail", "args": {"message": "oops"}},
                {"name": "t_repeat", "args": {"text": "x", "times": 5000}},
                {"name": "t_secret", "args": {}},
            ]
        },
        {"tool_calls": [{"name": "t_greet", "args": {"name": "bob"}}]},
        {"text": "never reached"},
    )
    policy = rules(tmp_path, 'ask = ["tool:t_greet"]\nallow = ["tool:t_*"]\n')
    first = client.submit("go", model=f"replay:{replay}", approval=policy, tools=["t"])
    events = client.events(first.session_id)
    # The first response's calls ran without asking, the unknown one asked nobody.
    outputs = {}
    while len(outputs) < 4:
        event = next_event(events, (ev.ToolOutput, ev.ApprovalRequest))
        assert isinstance(event, ev.ToolOutput), f"asked for {event.tool_name} before the calls ran"
        outputs[event.tool_name] = event
    assert outputs["t_add"].content == "5"
    assert outputs["t_fail"].content.startswith("MCP tool call failed: ")
    assert "oops" in outputs["t_fail"].content
    assert outputs["t_repeat"].truncated and len(outputs["t_repeat"].content) < 2100
    assert client.output(outputs["t_repeat"].output_ref) == "x" * 5000
    assert "Unknown tool 't_secret'" in outputs["t_secret"].content
    assert "t_add" in outputs["t_secret"].content
    request = next_event(events, ev.ApprovalRequest)
    assert (request.kind, request.tool_name, request.args) == ("tool", "t_greet", {"name": "bob"})
    client.reject(request.request_id, args_sha256=request.args_sha256, approver="carol")
    result = client.wait(first, timeout=60)
    assert (result.status, result.reason) == ("finished", "rejected")
    returns = tool_returns(fleet, first.session_id)
    assert returns["t_add"] == "5"
    assert "Rejected by carol" in returns["t_greet"]


def test_programmatic_calls_from_a_cell_are_gated_and_wait_outside_the_timeout(
    fleet: Fleet, client: Client, tmp_path: Path
):
    raw_call = (
        "import json\n"
        "from mcptools import _PROMPT\n"
        "request = {'server': 't', 'tool': 'pid', 'arguments': {},\n"
        "           'command': '/bin/false', 'args': ['-c', 'x'], 'url': 'http://evil',\n"
        "           'env': {'MCP_TEST_FAIL': '1'}}\n"
        "reply = json.loads(get_ipython().kernel.raw_input(_PROMPT + json.dumps(request)))\n"
        "print('pid', reply['structured']['result'])\n"
    )
    replay = write_replay(
        tmp_path / "r.jsonl",
        {
            "code": "from mcptools.t.add import run as add\n"
            "import inspect\n"
            "print('sum', add(a=2, b=40), inspect.signature(add))\n"
        },
        {"code": raw_call},
        {"code": "from mcptools.t.greet import run as greet\nprint(greet(name='eve'))\n"},
        {"text": "never reached"},
    )
    policy = rules(tmp_path, 'ask = ["tool:t_add", "tool:t_greet"]\nallow = ["code", "tool"]\n')
    handle = client.submit(
        "go", model=f"replay:{replay}", approval=policy, tools=["t"], execution_timeout=2.0
    )
    events = client.events(handle.session_id)
    request = next_event(events, ev.ApprovalRequest)
    assert (request.kind, request.tool_name, request.args) == ("tool", "t_add", {"a": 2, "b": 40})
    assert client.request(request.request_id).scope == "cell"  # made from code
    time.sleep(3)  # decided after the cell's 2 s timeout: the wait does not count
    client.approve(request.request_id, args_sha256=request.args_sha256, approver="alice")
    output = next_event(events, ev.CodeExecutionOutput)
    assert output.status == "ok", output.text
    assert "sum 42 (a: 'int', b: 'int') -> 'int'" in output.text
    # Extra fields the kernel sends are dropped: the configured server answered.
    output = next_event(events, ev.CodeExecutionOutput)
    assert output.status == "ok", output.text
    pid = int(output.text.split()[1])
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert SERVER.encode() in cmdline
    request = next_event(events, ev.ApprovalRequest)
    assert request.tool_name == "t_greet"
    client.reject(request.request_id, args_sha256=request.args_sha256, approver="bob")
    output = next_event(events, ev.CodeExecutionOutput)
    assert "ToolCallRejected" in output.text and "rejected by bob" in output.text
    result = client.wait(handle, timeout=60)
    assert (result.status, result.reason) == ("finished", "rejected")


def test_a_killed_server_reports_the_call_that_found_it_dead_then_restarts(
    fleet: Fleet, client: Client, tmp_path: Path
):
    pid_replay = write_replay(
        tmp_path / "pid.jsonl",
        {"tool_calls": [{"name": "t_pid", "args": {}}]},
        {"text": "ok"},
    )
    first = client.submit("go", model=f"replay:{pid_replay}", approval="auto", tools=["t"])
    assert client.wait(first, timeout=60).status == "finished"
    pid = int(tool_returns(fleet, first.session_id)["t_pid"])
    second = client.submit("go", model=f"replay:{pid_replay}", approval="auto", tools=["t"])
    assert client.wait(second, timeout=60).status == "finished"
    assert int(tool_returns(fleet, second.session_id)["t_pid"]) == pid  # shared per node
    os.kill(pid, signal.SIGKILL)
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"tool_calls": [{"name": "t_add", "args": {"a": 1, "b": 1}}]},
        {"tool_calls": [{"name": "t_pid", "args": {}}]},
        {"text": "ok"},
    )
    handle = client.submit("go", model=f"replay:{replay}", approval="auto", tools=["t"])
    assert client.wait(handle, timeout=60).status == "finished"
    returns = tool_returns(fleet, handle.session_id)
    assert returns["t_add"].startswith("MCP tool call failed: MCP server 't' stopped")
    assert int(returns["t_pid"]) != pid


def test_unknown_servers_are_refused_at_submission_naming_the_configured_ones(fleet: Fleet):
    done = cli(fleet.redis_url, "submit", "go", "--model", "openai:gpt-4o", "--tools", "t,nope")
    assert done.returncode == 3
    assert "unknown MCP server nope; the nodes have configured: broken, slow, t" in done.stderr


def test_a_server_that_takes_20_s_to_start_works_within_the_default_timeout(
    fleet: Fleet, client: Client, tmp_path: Path
):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"tool_calls": [{"name": "slow_add", "args": {"a": 20, "b": 22}}]},
        {"text": "ok"},
    )
    handle = client.submit("go", model=f"replay:{replay}", approval="auto", tools=["slow"])
    result = client.wait(handle, timeout=SLOW_START + 60)
    assert result.status == "finished", result
    assert tool_returns(fleet, handle.session_id)["slow_add"] == "42"


def test_a_server_that_cannot_start_fails_the_turn_naming_it(client: Client, tmp_path: Path):
    replay = write_replay(tmp_path / "r.jsonl", {"text": "never"})
    handle = client.submit("go", model=f"replay:{replay}", approval="auto", tools=["broken"])
    result = client.wait(handle, timeout=60)
    assert result.status == "failed"
    assert "MCP server 'broken' failed to start" in result.error
