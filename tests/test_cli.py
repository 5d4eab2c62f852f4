"""The CLI as a person and a script meet it: light to start (its start-up time is measured
by bench/cli_startup.py, not asserted here), exit codes that mean one thing each, errors in
one line that name the fault and the fix, nothing that waits silently, and a README whose
CLI lines and SDK example work as written."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pexpect
import pytest
import redis

from actfleet.broker import events as ev
from actfleet.broker.policy import load_policy
from actfleet.client import Client
from tests.conftest import ACTFLEET, ROOT, Fleet, cli, new_db_url, write_replay

HEAVY = (
    "pydantic_ai",
    "genai_prices",
    "jupyter_client",
    "ipykernel",
    "celery",
    "zmq",
    "openai",
    "bashlex",
)
README = (ROOT / "README.md").read_text()


def test_help_imports_no_model_kernel_or_celery_code():
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "actfleet", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0 and "Commands" in proc.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()}
    assert not imported & set(HEAVY)


# ---- helpers ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(new_db_url(redis_server), tmp_path_factory.mktemp("fleet"))
    try:
        fleet.start("cli1")
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def client(fleet: Fleet) -> Client:
    return Client(fleet.redis_url)


def environment(redis_url: str) -> dict[str, str]:
    return {**os.environ, "ACTFLEET_REDIS_URL": redis_url, "COLUMNS": "200", "NO_COLOR": "1"}


def in_terminal(redis_url: str, *args: str, command: str | None = None) -> pexpect.spawn:
    """`actfleet ARGS` (or a shell command) in a pseudo-terminal, as a person runs it."""
    env = {**environment(redis_url), "COLUMNS": "120"}
    if command is not None:
        return pexpect.spawn("bash", ["-c", command], env=env, encoding="utf-8", timeout=30)
    return pexpect.spawn(
        sys.executable, ["-m", "actfleet", *args], env=env, encoding="utf-8", timeout=30
    )


class Script:
    """`actfleet ARGS` as a script runs it: stdin closed, stdout and stderr piped; stderr's
    lines are read as they come, each with when it came."""

    def __init__(self, redis_url: str, *args: str, env: dict[str, str] | None = None):
        self.proc = subprocess.Popen(
            [*ACTFLEET, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**environment(redis_url), **(env or {})},
        )
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put((time.time(), line))

    def line(self, pattern: str, timeout: float) -> tuple[float, re.Match[str]]:
        """The first stderr line matching `pattern`, with when it came."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                at, line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no stderr line matching {pattern!r} in {timeout} s: {self.stderr}")
            self.stderr.append(line)
            if found := re.search(pattern, line):
                return at, found

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        """Exit code, stdout and the rest of stderr."""
        stdout, _ = self.proc.communicate(timeout=timeout)
        time.sleep(0.1)
        while not self.lines.empty():
            self.stderr.append(self.lines.get()[1])
        return self.proc.returncode, stdout, "".join(self.stderr)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def first(client: Client, session_id: str, cls: type) -> ev.Event:
    for event in client.events(session_id):
        if isinstance(event, cls):
            return event
    raise AssertionError("stream ended")


# ---- 4: approvals without a terminal; Ctrl-C ----------------------------------------


def test_run_in_a_script_says_on_stderr_how_to_decide_each_request(
    fleet: Fleet, client: Client, tmp_path: Path
):
    replay = write_replay(tmp_path / "r.jsonl", {"code": "print('asked')"}, {"text": "done"})
    run = Script(fleet.redis_url, "run", "go", "--model", f"replay:{replay}")  # like `| cat`
    try:
        _, found = run.line(r"actfleet approve (\S+) \(or actfleet reject (\S+)\)", 30)
        request_id = found[1]
        assert found[2] == request_id
        record = client.request(request_id)
        assert record.status == "pending"  # told while it waits, not after
        run.line(r"--approve auto", 5)
        client.approve(request_id, args_sha256=record.args_sha256)
        code, stdout, stderr = run.finish()
    finally:
        run.stop()
    assert code == 0, stderr
    assert "approve?" not in stdout and "actfleet approve" not in stdout
    assert "turn completed" in stdout


def test_run_in_a_terminal_with_stdout_in_a_file_prompts_nowhere_and_says_how_to_decide(
    fleet: Fleet, client: Client, tmp_path: Path
):
    replay = write_replay(tmp_path / "r.jsonl", {"code": "print('asked')"}, {"text": "done"})
    out = tmp_path / "out.txt"
    run = in_terminal(
        fleet.redis_url,
        command=f"{sys.executable} -m actfleet run go --model replay:{replay} > {out}",
    )
    run.expect(r"actfleet approve (\S+) \(or actfleet reject")
    record = client.request(run.match.group(1))
    client.approve(record.id, args_sha256=record.args_sha256)
    run.expect(pexpect.EOF)
    run.close()
    assert run.exitstatus == 0
    written = out.read_text()
    assert "approve?" not in written and "turn completed" in written


def test_ctrl_c_in_run_says_the_turn_goes_on_and_how_to_follow_or_stop_it(
    fleet: Fleet, client: Client, tmp_path: Path
):
    replay = write_replay(
        tmp_path / "r.jsonl", {"code": "import time; time.sleep(2)"}, {"text": "slept"}
    )
    run = in_terminal(
        fleet.redis_url, "run", "nap", "--model", f"replay:{replay}", "--approve", "auto"
    )
    run.expect(r"session (s-\w+)")
    session_id = run.match.group(1)
    run.expect(r"time\.sleep")
    run.sendintr()
    run.expect(
        f"interrupted; the turn goes on: actfleet watch {session_id} "
        f"\\(actfleet cancel {session_id} stops it\\)"
    )
    run.expect(pexpect.EOF)
    run.close()
    assert run.exitstatus == 130
    finished = first(client, session_id, ev.TurnFinished)
    assert (finished.reason, finished.response) == ("completed", "slept")


# ---- 7: one exit-code table ---------------------------------------------------------


def test_usage_errors_exit_64_and_run_help_and_the_readme_give_the_exit_codes():
    unused = "redis://127.0.0.1:1/0"
    for args in (["bogus"], ["run"], ["run", "x", "--model", "test", "--max-turns", "0"]):
        proc = cli(unused, *args, timeout=30)
        assert proc.returncode == 64, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    shown = cli(unused, "run", "--help", timeout=30).stdout
    table = re.sub(r"\s+", " ", shown)
    for code in ("0 completed", "1 failed or cancelled", "2 timeout", "3 bad input"):
        assert code in table
    assert "4 rejected, or stopped by --max-turns" in table and "64 usage error" in table
    for code, meaning in (
        ("0", "completed"),
        ("2", "--timeout"),
        ("4", "rejected"),
        ("64", "usage"),
    ):
        assert re.search(rf"^\| {code} +\| .*{meaning}", README, re.MULTILINE), code


def test_a_turn_stopped_by_max_turns_exits_4_shown_as_not_completed(fleet: Fleet, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl", {"code": "x = 1"}, {"code": "x = 2"}, {"text": "never"}
    )
    args = ["run", "loop", "--model", f"replay:{replay}", "--approve", "auto", "--max-turns", "1"]
    proc = cli(fleet.redis_url, *args)
    assert proc.returncode == 4, proc.stderr
    assert "turn not completed: stopped by its --max-turns limit" in proc.stdout
    assert "✓" not in proc.stdout


# ---- 8: unknown sessions ------------------------------------------------------------


def test_unknown_sessions_are_refused_by_watch_and_cancel_with_nothing_written(redis_url: str):
    from actfleet.client import UnknownSession

    for args in (["watch", "s-typo"], ["watch", "s-typo", "--no-follow"], ["cancel", "s-typo"]):
        proc = cli(redis_url, *args, timeout=20)
        assert proc.returncode == 3, (args, proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "no session 's-typo'" in proc.stderr
        assert "actfleet sessions" in proc.stderr and "cancelling" not in proc.stdout
    with pytest.raises(UnknownSession, match="no session 's-none'"):
        Client(redis_url).cancel("s-none")
    assert redis.Redis.from_url(redis_url).dbsize() == 0


def test_a_session_name_this_redis_does_not_know_is_said_to_start_a_new_session(
    fleet: Fleet, tmp_path: Path
):
    replay = write_replay(tmp_path / "r.jsonl", {"text": "hi"}, {"text": "again"})
    args = ["--model", f"replay:{replay}", "--approve", "auto", "--session", "s-fresh-name"]
    first_run = cli(fleet.redis_url, "run", "one", *args)
    assert first_run.returncode == 0, first_run.stderr
    assert "new session s-fresh-name" in first_run.stderr
    again = cli(fleet.redis_url, "run", "two", *args)
    assert again.returncode == 0 and "new session" not in again.stderr
    listed = cli(fleet.redis_url, "sessions")
    assert "s-fresh-name" in listed.stdout


# ---- 9: bad input is one line, never a traceback ------------------------------------


def test_watch_after_takes_a_stream_id_or_a_seq_and_refuses_anything_else(
    fleet: Fleet, client: Client, tmp_path: Path
):
    import json

    replay = write_replay(tmp_path / "r.jsonl", {"code": "print(1)"}, {"text": "done"})
    handle = client.submit("go", model=f"replay:{replay}", approval="auto")
    client.wait(handle, timeout=60)
    events = list(client.events(handle.session_id, follow=False))
    bogus = cli(fleet.redis_url, "watch", handle.session_id, "--after", "bogus")
    assert bogus.returncode == 3 and bogus.stderr.count("\n") == 1
    assert "--after 'bogus' is neither a stream id" in bogus.stderr
    for after in ("2", events[1].id):
        shown = cli(
            fleet.redis_url, "watch", handle.session_id, "--after", after, "--no-follow", "--json"
        )
        assert shown.returncode == 0, shown.stderr
        seqs = [json.loads(line)["seq"] for line in shown.stdout.splitlines()]
        assert seqs == [e.seq for e in events[2:]]


def test_a_bad_redis_url_or_log_level_is_an_error_naming_the_fix_not_a_traceback(
    tmp_path: Path,
):
    for args in (
        ["watch", "s-1", "--redis-url", "notaurl"],
        ["run", "x", "--model", "test", "--redis-url", "redis://host:port/0"],
        ["worker", "--redis-url", "notaurl"],
    ):
        proc = cli("redis://127.0.0.1:1/0", *args, timeout=30)
        assert proc.returncode == 3, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "redis://[:PASSWORD@]HOST:PORT/DB" in proc.stderr
    loud = cli("redis://127.0.0.1:1/0", "worker", "--loglevel", "LOUD", timeout=30)
    assert loud.returncode == 64 and "Traceback" not in loud.stderr
    assert "DEBUG, INFO, WARNING, ERROR" in loud.stderr


# ---- 10: waiting is visible ---------------------------------------------------------


def test_run_with_no_node_says_so_within_a_few_seconds_and_keeps_waiting(
    redis_url: str, tmp_path: Path
):
    replay = write_replay(tmp_path / "r.jsonl", {"text": "hi"})
    run = Script(redis_url, "run", "x", "--model", f"replay:{replay}", "--approve", "auto")
    try:
        started = time.time()
        at, _ = run.line(r"no worker node is running: start one with `actfleet worker`", 10)
        assert at - started < 5
        assert run.proc.poll() is None
    finally:
        run.stop()
    terminal = in_terminal(
        redis_url, "run", "x", "--model", f"replay:{replay}", "--approve", "auto"
    )
    terminal.expect("waiting for the model")
    terminal.expect("no worker node is running")
    terminal.close(force=True)


def test_approvals_watch_and_interactive_say_they_are_waiting(redis_url: str):
    listing = Script(redis_url, "approvals", "--watch")
    try:
        listing.line(r"waiting for approval requests\.\.\. \(Ctrl-C to stop\)", 10)
    finally:
        listing.stop()
    walker = in_terminal(redis_url, "approvals", "--interactive")
    walker.expect(r"waiting for approval requests\.\.\. \(Ctrl-C to stop\)")
    walker.close(force=True)


def test_a_second_node_with_a_live_nodes_name_is_refused_at_once(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("twin")
    proc = subprocess.run(
        [*ACTFLEET, "worker", "--name", "twin"],
        capture_output=True,
        text=True,
        timeout=25,  # a heartbeat TTL of 30 s, waited out, would not end in time
        env={**fleet.env, "ACTFLEET_LEASE_TTL": "30"},
        cwd=fleet.workdir,
    )
    assert proc.returncode == 3, proc.stderr
    assert "a node named 'twin' is running" in proc.stderr


# ---- 11: help and README ------------------------------------------------------------


def _readme_block(heading: str, fence: str) -> str:
    section = README.split(f"\n{heading}\n", 1)[1]
    return section.split(fence, 1)[1].split("```", 1)[0]


def test_every_cli_line_of_the_readme_parses_with_the_real_cli():
    block = _readme_block("## CLI", "```\n")
    flags: dict[str, set[str]] = {}
    command = ""
    for line in block.splitlines():
        if line.startswith("actfleet "):
            words = line.split()
            command = "" if words[1].startswith("-") else words[1]
            if command in GROUPS:
                command = f"{command} {words[2]}"
            text = line
        elif line.strip().startswith("["):
            text = line
        else:
            continue
        flags.setdefault(command, set()).update(re.findall(r"(?<![\w-])--?[a-z][\w-]*", text))
        if "[same options]" in text:  # submit takes run's options
            run = f"{command.split()[0]} run" if " " in command else "run"
            flags[command] |= flags[run] - {"--json", "--timeout", "--output", "-o"}
    commands = {c for c in flags if c}
    helps = {c: _help(c) for c in ["", *commands, *GROUPS]}
    listed = set(re.findall(r"^│ ([a-z][\w-]+) ", helps[""], re.MULTILINE))
    assert listed == {c.split()[0] for c in commands}, "README CLI and the real commands differ"
    for group in GROUPS:
        listed = set(re.findall(r"^│ ([a-z][\w-]+) ", helps[group], re.MULTILINE))
        assert {f"{group} {c}" for c in listed} == {c for c in commands if c.startswith(group)}
    for name, shown in flags.items():
        for flag in shown:
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[name]), (name, flag)
    for name in commands:  # and the README leaves none out (--redis-url: said once for all)
        rows = re.findall(r"^│ +(?:\* +)?(--[a-z][\w-]*)(?: +(-[a-zA-Z]) )?", helps[name], re.M)
        assert len(rows) > 1, f"no options read from the help of {name}"
        missing = {long for long, short in rows if not {long, short} & flags[name]}
        missing -= {"--help", "--redis-url"}
        assert not missing, f"README leaves out {name} {sorted(missing)}"


GROUPS = ("batch",)
"""Commands with subcommands (`actfleet batch run ...`)."""


def _help(command: str) -> str:
    proc = subprocess.run(
        [*ACTFLEET, *command.split(), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_help_shows_whole_sentences_flags_without_values_and_the_version():
    top = _help("")
    summaries = re.findall(r"^│ [a-z][\w-]+ +(.+?) *│$", top, re.MULTILINE)
    assert len(summaries) >= 12 and all(s.endswith(".") for s in summaries), summaries
    assert "<bool>" not in top and "<bool>" not in _help("run")
    assert "the session whose requests to approve" in _help("approve")
    worker = _help("worker")
    assert "--redis-url" in worker and "subagent_task" in worker
    shown = subprocess.run([*ACTFLEET, "--version"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and shown.stdout.strip() == f"actfleet {version('actfleet')}"


def test_approve_refuses_an_unknown_kind_naming_the_kinds():
    proc = cli("redis://127.0.0.1:1/0", "approve", "--all", "-s", "s-1", "--kind", "bogus")
    assert proc.returncode == 64 and "code, shell, tool, subagent" in proc.stderr


def test_the_readme_rules_example_loads_and_names_only_what_exists(tmp_path: Path):
    rules = tmp_path / "rules.toml"
    rules.write_text(_readme_block("## Approvals", "```toml\n"))
    load_policy(str(rules))
    entries = [e for v in tomllib.loads(rules.read_text()).values() for e in v]
    assert not [e for e in entries if e.startswith("tool:")], "no tools but code and subagents"


# ---- 12: the README's SDK example ---------------------------------------------------


def test_the_readme_sdk_example_runs_against_a_real_fleet_and_stops_at_the_main_turn(
    fleet: Fleet, tmp_path: Path
):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"tool_calls": [{"name": "subagent_task", "args": {"prompt": "count"}}]},
        {"code": "print('main')"},
        {"text": "main done"},
        {"agent": "sub", "code": "print(2)"},
        {"agent": "sub", "text": "sub done"},
    )
    code = _readme_block("## Python SDK", "```python\n")
    assert '"anthropic:claude-sonnet-4-5"' in code
    code = code.replace('"anthropic:claude-sonnet-4-5"', repr(f"replay:{replay}"))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(fleet.redis_url),
    )
    assert proc.returncode == 0, proc.stderr
    *events, result = proc.stdout.splitlines()
    assert result == "finished completed main done"
    assert events[-1].split()[1:] == ["main", "TurnFinished"]
    assert any(e.split()[1].startswith("sub-") and e.endswith("TurnFinished") for e in events)
    assert sum(e.endswith("ApprovalRequest") for e in events) >= 3  # subagent, its code, code
