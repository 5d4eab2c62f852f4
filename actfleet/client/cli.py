"""The client commands of the `actfleet` CLI: run, submit, watch, export, demo."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from actfleet.client.render import Renderer, json_line

app = typer.Typer(
    help="Run CodeAct agents as distributed work on Redis and Celery.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_INPUT = 3
"""Exit code for bad input or configuration (the error says what to do)."""

Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="pydantic-ai model string, e.g. openai-chat:gpt-4o-mini, or replay:<file.jsonl>.",
    ),
]
Session = Annotated[
    str | None, typer.Option("--session", "-s", help="Continue this session (default: a new one).")
]
Json = Annotated[bool, typer.Option("--json", help="One JSON object per line per event.")]
Approve = Annotated[
    str,
    typer.Option(
        "--approve",
        help="Approval policy: auto, ask, or a TOML rules file (deny / ask / allow lists).",
    ),
]
ApprovalTimeout = Annotated[
    float | None,
    typer.Option(help="Seconds a request may wait; an expired request counts as rejected."),
]
As = Annotated[str | None, typer.Option("--as", help="Approver name (default: OS user).")]
MaxSubagents = Annotated[
    int | None, typer.Option(min=1, help="Subagents a parent runs at once (default 5).")
]
MaxTurns = Annotated[
    int | None, typer.Option(min=1, help="Tool-execution rounds before the turn ends.")
]
Network = Annotated[
    str | None,
    typer.Option(
        help="none: a new session's kernels get no network, whatever the nodes allow.",
    ),
]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar="ACTFLEET_REDIS_URL",
        help="Redis URL (default redis://127.0.0.1:6379/0).",
    ),
]


def _fail(message: str, code: int = EXIT_INPUT) -> typer.Exit:
    typer.secho(f"error: {message}", fg="red", err=True)
    return typer.Exit(code)


def _client(redis_url: str | None):  # noqa: ANN202 - keeps the SDK import lazy
    from actfleet.client.sdk import Client

    return Client(redis_url)


def _connected(redis_url: str | None):  # noqa: ANN202 - keeps the SDK import lazy
    """A client whose Redis answers, or a one-line error saying what to do."""
    from actfleet.client.sdk import RedisUnavailable

    client = _client(redis_url)
    try:
        client.ping()
    except RedisUnavailable as exc:
        raise _fail(str(exc)) from None
    return client


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="What the agent should do.")],
    model: Model,
    session: Session = None,
    json_out: Json = False,
    timeout: Annotated[
        float | None, typer.Option(help="Give up after this many seconds (exit 2).")
    ] = None,
    approve: Approve = "ask",
    approval_timeout: ApprovalTimeout = None,
    max_subagents: MaxSubagents = None,
    max_turns: MaxTurns = None,
    network: Network = None,
    redis_url: RedisUrl = None,
) -> None:
    """Submit a turn and stream the session's events until it ends. With --approve ask in a
    terminal, requests are decided here (y/n/a/q); otherwise they wait for decisions made
    elsewhere (actfleet approvals).

    Exit 0 when the turn finished, 1 when it failed or was cancelled, 2 on timeout."""
    from actfleet.broker.events import ApprovalRequest, TurnFinished
    from actfleet.client.sdk import RedisUnavailable, is_terminal_for

    client = _client(redis_url)
    try:
        client.ping()
        cursor = client.last_event_id(session) if session else "0-0"
        handle = client.submit(
            prompt,
            model=model,
            session_id=session,
            approval=approve,
            network=network,
            **_options(approval_timeout, max_subagents, max_turns),
        )
    except (ValueError, RedisUnavailable) as exc:
        raise _fail(str(exc)) from None
    walker = None
    if sys.stdin.isatty() and not json_out:
        from actfleet.client.approval_prompt import Walker

        walker = Walker(client, Renderer().console)
    if timeout is not None:
        signal.signal(signal.SIGALRM, _on_timeout)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    renderer = None if json_out else Renderer()
    if renderer is not None:
        renderer.console.print(f"[dim]session {handle.session_id}[/]")
    try:
        for event in client.events(handle.session_id, cursor):
            if renderer is None:
                print(json_line(event), flush=True)
            else:
                renderer.show(event)
            if walker is not None and isinstance(event, ApprovalRequest):
                record = client.request(event.request_id)
                if record.status == "pending" and not walker.handle(record):
                    walker = None
            if is_terminal_for(event, handle.turn_id):
                raise typer.Exit(0 if isinstance(event, TurnFinished) else 1)
    except _Timeout:
        raise _fail(
            f"turn {handle.turn_id} did not end within {timeout} s; it goes on: "
            f"actfleet watch {handle.session_id}",
            code=2,
        ) from None


class _Timeout(Exception):
    pass


def _on_timeout(signum: int, frame: object) -> None:
    raise _Timeout


@app.command()
def submit(
    prompt: Annotated[str, typer.Argument(help="What the agent should do.")],
    model: Model,
    session: Session = None,
    approve: Approve = "ask",
    approval_timeout: ApprovalTimeout = None,
    max_subagents: MaxSubagents = None,
    max_turns: MaxTurns = None,
    network: Network = None,
    redis_url: RedisUrl = None,
) -> None:
    """Submit a turn and print its session id at once."""
    from actfleet.client.sdk import RedisUnavailable

    try:
        handle = _client(redis_url).submit(
            prompt,
            model=model,
            session_id=session,
            approval=approve,
            network=network,
            **_options(approval_timeout, max_subagents, max_turns),
        )
    except (ValueError, RedisUnavailable) as exc:
        raise _fail(str(exc)) from None
    print(handle.session_id)


@app.command()
def watch(
    session: Annotated[str, typer.Argument(help="The session to follow.")],
    after: Annotated[
        str | None,
        typer.Option(help="Stream id of the last event seen: show only events after it."),
    ] = None,
    json_out: Json = False,
    no_follow: Annotated[
        bool, typer.Option("--no-follow", help="Print what is there and exit.")
    ] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Show a session's events, from the start or after an event id; follows new ones."""
    client = _connected(redis_url)
    renderer = None if json_out else Renderer()
    try:
        for event in client.events(session, after, follow=not no_follow):
            if renderer is None:
                print(json_line(event), flush=True)
            else:
                renderer.show(event)
    except KeyboardInterrupt:
        pass


@app.command()
def export(
    session: Annotated[str, typer.Argument(help="The session to write out.")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Directory to write to (default: ./SESSION)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite files an earlier export wrote there.")
    ] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Write a session out as freeact stores sessions: main.jsonl and sub-*.jsonl (one line
    per model message), plus events.jsonl (as watch --json prints them). Existing files
    are refused unless --force. Export before ACTFLEET_RETENTION expires the session."""
    client = _connected(redis_url)
    try:
        result = client.export(session, output, force=force)
    except (ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    for path, count in result.messages.items():
        print(f"{path}: {count} messages")
    print(f"{result.events_file}: {result.events} events")
    if result.first_seq > 1:
        typer.secho(
            f"note: the stream was trimmed (ACTFLEET_STREAM_MAXLEN): events before seq "
            f"{result.first_seq} are gone; the histories are complete",
            fg="yellow",
            err=True,
        )
    for agent in result.agents_without_messages:
        typer.secho(
            f"note: {agent} has no messages (not started yet, or its history expired)",
            fg="yellow",
            err=True,
        )


def _options(
    approval_timeout: float | None, max_subagents: int | None, max_turns: int | None
) -> dict[str, float | int]:
    given = {
        "approval_timeout": approval_timeout,
        "max_subagents": max_subagents,
        "max_turns": max_turns,
    }
    return {k: v for k, v in given.items() if v is not None}


@app.command()
def approvals(
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="Only this session.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per request.")] = False,
    watch_: Annotated[bool, typer.Option("--watch", help="Keep listing new requests.")] = False,
    interactive: Annotated[
        bool,
        typer.Option(
            "--interactive",
            "-i",
            help="Decide requests as they arrive: y approve, n reject, a approve matching, q quit.",
        ),
    ] = False,
    approver: As = None,
    redis_url: RedisUrl = None,
) -> None:
    """List pending approval requests (code highlighted), or decide them as they arrive."""
    from actfleet.client.approval_prompt import Walker, show

    client = _connected(redis_url)
    console = Renderer().console
    walker = Walker(client, console, approver) if interactive else None
    shown: set[str] = set()

    def unreadable(request_id: str, why: str) -> None:
        if request_id not in shown:
            shown.add(request_id)
            typer.secho(f"warning: skipping request {request_id}: {why}", fg="yellow", err=True)

    try:
        while True:
            for record in client.pending(session, on_unreadable=unreadable):
                if walker is not None:
                    if not walker.handle(record):
                        return
                elif record.id not in shown:
                    shown.add(record.id)
                    if json_out:
                        print(json_line(record.to_dict()), flush=True)
                    else:
                        show(console, record)
            if not (watch_ or interactive):
                if not shown and not json_out:
                    console.print("[dim]no pending requests[/]")
                return
            time.sleep(0.3)
    except KeyboardInterrupt:
        pass


@app.command()
def approve(
    request_id: Annotated[str | None, typer.Argument(help="The request to approve.")] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Every pending request of --session.")
    ] = False,
    session: Annotated[str | None, typer.Option("--session", "-s")] = None,
    kind: Annotated[
        str | None, typer.Option(help="With --all: only code, shell, tool or subagent requests.")
    ] = None,
    approver: As = None,
    redis_url: RedisUrl = None,
) -> None:
    """Approve a request (shows what is approved and sends its hash), or --all of a session."""
    _decide(redis_url, request_id, all_, session, kind, approver, reject_reason=None)


@app.command()
def reject(
    request_id: Annotated[str, typer.Argument(help="The request to reject.")],
    reason: Annotated[str, typer.Option(help="Told to the model.")] = "",
    approver: As = None,
    redis_url: RedisUrl = None,
) -> None:
    """Reject a request: the turn ends, and the model is told it was rejected, and why."""
    _decide(redis_url, request_id, False, None, None, approver, reject_reason=reason)


def _decide(
    redis_url: str | None,
    request_id: str | None,
    all_: bool,
    session: str | None,
    kind: str | None,
    approver: str | None,
    reject_reason: str | None,
) -> None:
    from actfleet.broker.approvals import DecisionRefused
    from actfleet.client.approval_prompt import show

    client = _connected(redis_url)
    console = Renderer().console
    try:
        if all_:
            if not session or request_id:
                raise _fail("--all needs --session S and no request id")
            records = [r for r in client.pending(session) if kind in (None, r.kind)]
        elif request_id:
            records = [client.request(request_id)]
        else:
            raise _fail("name a request id (see actfleet approvals), or use --all --session S")
        failed = False
        for record in records:
            show(console, record)
            try:
                if reject_reason is None:
                    client.approve(record.id, args_sha256=record.args_sha256, approver=approver)
                    console.print(f"[green]approved {record.id}[/]")
                else:
                    client.reject(
                        record.id,
                        args_sha256=record.args_sha256,
                        reason=reject_reason,
                        approver=approver,
                    )
                    console.print(f"[red]rejected {record.id}[/]")
            except DecisionRefused as exc:
                typer.secho(f"error: {exc}", fg="red", err=True)
                failed = True
        if all_ and not records:
            console.print("[dim]no pending requests[/]")
    except DecisionRefused as exc:
        raise _fail(str(exc)) from None
    if failed:
        raise typer.Exit(EXIT_INPUT)


@app.command()
def cancel(
    session: Annotated[str, typer.Argument(help="The session to cancel.")],
    redis_url: RedisUrl = None,
) -> None:
    """Cancel a session: its model streams stop, its cells are interrupted, its pending
    approvals are withdrawn and its subagents end, on whatever nodes they run."""

    _connected(redis_url).cancel(session)
    print(f"cancelling {session}")


@app.command("dead-letters")
def dead_letters(
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, help="How many, newest first.")
    ] = 20,
    json_out: Json = False,
    redis_url: RedisUrl = None,
) -> None:
    """Messages nodes could not read or run (bad queue messages, malformed step arguments,
    junk on the reply channels, broken records), newest first, with the reason."""
    entries = _connected(redis_url).dead_letters(limit)
    for entry in entries:
        if json_out:
            print(json_line(entry))
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(entry.get("ts") or 0)))
        print(f"{when}  {entry.get('source', '?')}  {entry.get('reason', '')}")
        if entry.get("preview"):
            print(f"    {entry['preview'][:120]!r} ({entry.get('size', '?')} bytes)")
    if not entries and not json_out:
        print("no dead letters")


@app.command()
def demo(
    redis_url: RedisUrl = None,
) -> None:
    """The main job on a fresh machine: a private Redis (unless --redis-url), two worker nodes,
    the bundled example prompts with bundled replay files, live events, a results table."""
    from actfleet.client.demo import run_demo

    raise typer.Exit(run_demo(redis_url))


@app.command()
def output(
    ref: Annotated[str, typer.Argument(help="A truncated output's ref, as run and watch show it.")],
    redis_url: RedisUrl = None,
) -> None:
    """Print the whole output of a cell whose output was truncated (the model and the
    terminal got its head and tail). Kept for ACTFLEET_OUTPUT_TTL seconds (7 days)."""
    client = _connected(redis_url)
    try:
        whole = client.output(ref)
    except KeyError as exc:
        raise _fail(str(exc.args[0])) from None
    sys.stdout.write(whole if whole.endswith("\n") or not whole else whole + "\n")
