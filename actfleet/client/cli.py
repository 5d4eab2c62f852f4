"""The client commands of the `actfleet` CLI: run, submit, watch, export, approvals, demo."""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from actfleet.client.render import Renderer, json_line

if TYPE_CHECKING:
    from rich.console import Console
    from rich.status import Status

    from actfleet.broker.events import Event
    from actfleet.client.sdk import Client

EXIT_COMPLETED = 0
EXIT_FAILED = 1
"""The turn failed or was cancelled."""
EXIT_TIMEOUT = 2
EXIT_INPUT = 3
"""Bad input or configuration (the error says what to do)."""
EXIT_STOPPED = 4
"""The turn ended without completing: a request was rejected, or --max-turns or a budget
(--max-cost, --max-tokens) stopped it."""
EXIT_USAGE = 64
"""The command line itself is wrong (EX_USAGE): an unknown command or option, a bad value."""
EXIT_INTERRUPTED = 130

EXIT_CODES = (
    "Exit codes: 0 completed; 1 failed or cancelled; 2 timeout (the turn goes on); "
    "3 bad input (the error says what to do); 4 rejected, or stopped by --max-turns or a "
    "budget (--max-cost, --max-tokens); "
    "64 usage error; 130 interrupted by Ctrl-C (the turn goes on)."
)

_UsageError: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)
"""click's UsageError, as the typer in use raises it (recent typers vendor click)."""


@contextmanager
def _usage_exits_64() -> Iterator[None]:
    try:
        yield
    except _UsageError as exc:
        exc.exit_code = EXIT_USAGE  # type: ignore[attr-defined]
        raise


class _Group(TyperGroup):
    """The `actfleet` group: usage errors exit 64 (click's 2 is the timeout code here),
    and flags show no `<bool>` in help (they take no value)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if getattr(param, "is_flag", False):
                _bare(param)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _usage_exits_64():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with _usage_exits_64():
            return super().invoke(ctx)

    def get_help_option(self, ctx: Any) -> Any:
        return _bare(super().get_help_option(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            for param in command.params:
                if getattr(param, "is_flag", False):
                    _bare(param)
            _bare(command.get_help_option(ctx))
        return command


def _bare(option: Any) -> Any:
    """A flag shown without a value placeholder."""
    if option is not None:
        option.metavar = ""
    return option


app = typer.Typer(
    cls=_Group,
    help="Run CodeAct agents as distributed work on Redis and Celery.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


def _version(show: bool) -> None:
    if show:
        from importlib.metadata import version

        print(f"actfleet {version('actfleet')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """The options before any command."""


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
MaxCost = Annotated[
    float | None,
    typer.Option(
        min=0,
        help="Budget in USD: no model step starts once the turn's priced steps cost this "
        "(steps of a model with no known price count 0). The turn ends with reason budget.",
    ),
]
MaxTokens = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Budget in tokens (input + output, subagents included): no model step starts "
        "once the turn used this many. The turn ends with reason budget.",
    ),
]
Network = Annotated[
    str | None,
    typer.Option(
        help="none: a new session's kernels get no network, whatever the nodes allow.",
    ),
]
Tools = Annotated[
    str | None,
    typer.Option(
        "--tools",
        help="MCP servers (configured on the workers) whose tools this turn may use: NAME,...",
    ),
]
Limit = Annotated[int, typer.Option("--limit", "-n", min=1, help="How many, newest first.")]
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


def _note(message: str) -> None:
    """A line for the person on stderr, away from the output a program reads."""
    typer.secho(message, fg="yellow", err=True)


def _client(redis_url: str | None) -> Client:
    """A client (bad settings, such as a Redis URL that is not one, are a one-line error)."""
    from actfleet.client.sdk import Client

    try:
        return Client(redis_url)
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _connected(redis_url: str | None) -> Client:
    """A client whose Redis answers, or a one-line error saying what to do."""
    from actfleet.client.sdk import RedisUnavailable

    client = _client(redis_url)
    try:
        client.ping()
    except RedisUnavailable as exc:
        raise _fail(str(exc)) from None
    return client


def _existing(client: Client, session_id: str) -> None:
    """Exit 3, naming what to do, unless the session exists."""
    from actfleet.client.sdk import UnknownSession

    try:
        if not client.session_exists(session_id):
            raise UnknownSession(session_id)
    except (ValueError, UnknownSession) as exc:
        raise _fail(str(exc)) from None


@app.command(epilog=EXIT_CODES)
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
    max_cost: MaxCost = None,
    max_tokens: MaxTokens = None,
    network: Network = None,
    tools: Tools = None,
    redis_url: RedisUrl = None,
) -> None:
    """Submit a turn and stream the session's events until it ends.

    With --approve ask (the default) in a terminal (stdin and stdout), each request is
    decided here: y approve, n reject, a approve this and later matching ones, q stop
    asking. Otherwise each request's id and the commands that decide it are printed on
    stderr (actfleet approve ID / actfleet reject ID). Ctrl-C stops following; the turn
    goes on."""
    from actfleet.broker.events import ApprovalRequest, TurnFinished
    from actfleet.client.sdk import RedisUnavailable, is_terminal_for

    client = _client(redis_url)
    try:
        client.ping()
        new_name = session is not None and not client.session_exists(session)
        cursor = client.last_event_id(session) if session else "0-0"
        handle = client.submit(
            prompt,
            model=model,
            session_id=session,
            approval=approve,
            network=network,
            tools=_tool_names(tools),
            **_options(approval_timeout, max_subagents, max_turns, max_cost, max_tokens),
        )
    except (ValueError, RedisUnavailable) as exc:
        raise _fail(str(exc)) from None
    if new_name:
        _note(f"new session {session} (this Redis had none of that name)")
    renderer = None if json_out else Renderer()
    walker = None
    if renderer is not None and sys.stdin.isatty() and sys.stdout.isatty():
        from actfleet.client.approval_prompt import Walker

        walker = Walker(client, renderer.console)
    spinner = _Spinner(renderer.console if renderer is not None else None)
    if renderer is not None:
        renderer.console.print(f"[dim]session {handle.session_id}[/]")
    deadline = None if timeout is None else time.monotonic() + timeout
    told_how_to_avoid = False
    try:
        for event in _following(client, handle.session_id, cursor, deadline, spinner):
            if renderer is None:
                print(json_line(event), flush=True)
            else:
                renderer.show(event)
            if isinstance(event, ApprovalRequest):
                if walker is not None:
                    record = client.request(event.request_id)
                    if record.status == "pending" and not walker.handle(record):
                        walker = None  # q: this request and later ones are decided elsewhere
                if walker is None:
                    _how_to_decide(event.request_id, not told_how_to_avoid)
                    told_how_to_avoid = True
            if is_terminal_for(event, handle.turn_id):
                if not isinstance(event, TurnFinished):
                    raise typer.Exit(EXIT_FAILED)
                raise typer.Exit(EXIT_COMPLETED if event.reason == "completed" else EXIT_STOPPED)
            spinner.after(event, asked_here=walker is not None)
    except _Timeout:
        raise _fail(
            f"turn {handle.turn_id} did not end within {timeout} s; it goes on: "
            f"actfleet watch {handle.session_id}",
            code=EXIT_TIMEOUT,
        ) from None
    except KeyboardInterrupt:
        spinner.stop()
        _note(
            f"interrupted; the turn goes on: actfleet watch {handle.session_id} "
            f"(actfleet cancel {handle.session_id} stops it)"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        spinner.stop()


NO_NODE_AFTER = 2.0
"""Seconds `run` waits before it says that no worker node is running."""


class _Timeout(Exception):
    pass


def _how_to_decide(request_id: str, avoid: bool) -> None:
    """On stderr: the request waits, and the commands that decide it."""
    _note(
        f"approval {request_id} waits for a decision: actfleet approve {request_id} "
        f"(or actfleet reject {request_id}) from any shell; actfleet approvals shows it"
    )
    if avoid:
        _note(
            "to run without asking, submit with --approve auto, or --approve RULES.toml "
            "(allow/ask/deny rules; see the README's Approvals)"
        )


def _following(
    client: Client,
    session_id: str,
    cursor: str,
    deadline: float | None,
    spinner: _Spinner,
) -> Iterator[Event]:
    """The session's events, read on a thread so that this one stays free to say, while
    it waits, that no worker node is running, to keep the spinner going and to time out
    (_Timeout)."""
    events: queue.Queue[Event | BaseException] = queue.Queue()

    def pump() -> None:
        try:
            for event in client.events(session_id, cursor):
                events.put(event)
        except BaseException as exc:  # handed to the reader
            events.put(exc)

    threading.Thread(target=pump, name="actfleet-events", daemon=True).start()
    check_nodes_at = time.monotonic() + NO_NODE_AFTER
    nodes_seen = True
    while True:
        try:
            item = events.get(timeout=0.1)
        except queue.Empty:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise _Timeout from None
            if now >= check_nodes_at:
                check_nodes_at = now + NO_NODE_AFTER
                up = bool(client.live_nodes())
                if not up and nodes_seen:
                    with spinner.paused():
                        _note(
                            "no worker node is running: start one with `actfleet worker` "
                            "(same ACTFLEET_REDIS_URL); the turn waits for it"
                        )
                nodes_seen = up
            continue
        if isinstance(item, BaseException):
            raise item
        spinner.before(item)
        yield item


class _Spinner:
    """A status line while `run` waits in a terminal: what it waits for."""

    def __init__(self, console: Console | None):
        self.console = console if console is not None and console.is_terminal else None
        self.status: Status | None = None
        self.what = ""

    def before(self, event: Event) -> None:
        """Clear the line for an event that shows something."""
        from actfleet.broker import events as ev

        if not isinstance(event, ev.ResponseChunk):
            self.stop()

    def after(self, event: Event, asked_here: bool = False) -> None:
        """Show what comes after this event (nothing after streamed thoughts or output:
        their line may be open)."""
        from actfleet.broker import events as ev

        if self.console is None or isinstance(
            event, (ev.ThoughtsChunk, ev.CodeExecutionOutputChunk)
        ):
            return
        if isinstance(event, ev.ResponseChunk):  # shown once complete
            what = "the model is answering"
        elif isinstance(event, ev.ApprovalRequest) and not asked_here:
            what = f"waiting for a decision on {event.request_id}"
        elif isinstance(event, ev.CodeAction):
            what = "running the code"
        elif isinstance(event, ev.ApprovalDecision) and event.approved:
            what = "running what was approved"
        elif isinstance(event, ev.SubagentStarted):
            what = "subagents running"
        else:
            what = "waiting for the model"
        if self.status is not None and what == self.what:
            return
        self.stop()
        self.what = what
        self.status = self.console.status(f"[dim]{what}…[/]", spinner="dots")
        with _interrupt_held():
            self.status.start()

    def stop(self) -> None:
        if self.status is not None:
            with _interrupt_held():
                self.status.stop()
            self.status = None

    @contextmanager
    def paused(self) -> Iterator[None]:
        status, self.status = self.status, None
        if status is not None:
            with _interrupt_held():
                status.stop()
        try:
            yield
        finally:
            if status is not None:
                self.status = status
                with _interrupt_held():
                    status.start()


@contextmanager
def _interrupt_held() -> Iterator[None]:
    """Ctrl-C waits until the block is done: rich's status line, cut halfway through its
    start or stop, fails with a traceback when it is stopped next."""
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            raise KeyboardInterrupt


@app.command()
def submit(
    prompt: Annotated[str, typer.Argument(help="What the agent should do.")],
    model: Model,
    session: Session = None,
    approve: Approve = "ask",
    approval_timeout: ApprovalTimeout = None,
    max_subagents: MaxSubagents = None,
    max_turns: MaxTurns = None,
    max_cost: MaxCost = None,
    max_tokens: MaxTokens = None,
    network: Network = None,
    tools: Tools = None,
    redis_url: RedisUrl = None,
) -> None:
    """Submit a turn and print its session id at once (follow it with actfleet watch)."""
    from actfleet.client.sdk import RedisUnavailable

    client = _client(redis_url)
    try:
        client.ping()
        new_name = session is not None and not client.session_exists(session)
        handle = client.submit(
            prompt,
            model=model,
            session_id=session,
            approval=approve,
            network=network,
            tools=_tool_names(tools),
            **_options(approval_timeout, max_subagents, max_turns, max_cost, max_tokens),
        )
    except (ValueError, RedisUnavailable) as exc:
        raise _fail(str(exc)) from None
    if new_name:
        _note(f"new session {session} (this Redis had none of that name)")
    if not client.live_nodes():
        _note("no worker node is running: the turn waits until one starts (`actfleet worker`)")
    print(handle.session_id)


@app.command()
def watch(
    session: Annotated[str, typer.Argument(help="The session to follow.")],
    after: Annotated[
        str | None,
        typer.Option(
            help="Show only the events after this one: its stream id (`id` in --json, "
            "like 1712345678901-0) or its seq number.",
        ),
    ] = None,
    json_out: Json = False,
    no_follow: Annotated[
        bool, typer.Option("--no-follow", help="Print what is there and exit.")
    ] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Show a session's events, from the start or after an event, and follow new ones."""
    client = _connected(redis_url)
    _existing(client, session)
    try:
        events = client.events(session, after, follow=not no_follow)
    except ValueError as exc:
        raise _fail(f"--after {exc}") from None
    renderer = None if json_out else Renderer()
    try:
        for event in events:
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
    """Write a session out as freeact stores sessions, into a directory.

    main.jsonl and sub-*.jsonl (one line per model message), plus events.jsonl (as watch
    --json prints them). Existing files are refused unless --force. Export before
    ACTFLEET_RETENTION expires the session."""
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


REQUEST_KINDS = ("code", "shell", "tool", "subagent")
"""The kinds of approval requests."""


def _tool_names(tools: str | None) -> list[str]:
    """`--tools a,b` as a list of server names."""
    return [name.strip() for name in (tools or "").split(",") if name.strip()]


def _options(
    approval_timeout: float | None,
    max_subagents: int | None,
    max_turns: int | None,
    max_cost: float | None = None,
    max_tokens: int | None = None,
) -> dict[str, float | int]:
    given = {
        "approval_timeout": approval_timeout,
        "max_subagents": max_subagents,
        "max_turns": max_turns,
        "max_cost": max_cost,
        "max_tokens": max_tokens,
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
    if session is not None:
        _existing(client, session)
    console = Renderer().console
    walker = Walker(client, console, approver) if interactive else None
    shown: set[str] = set()

    def unreadable(request_id: str, why: str) -> None:
        if request_id not in shown:
            shown.add(request_id)
            typer.secho(f"warning: skipping request {request_id}: {why}", fg="yellow", err=True)

    waiting = False
    try:
        while True:
            fresh = [
                r for r in client.pending(session, on_unreadable=unreadable) if r.id not in shown
            ]
            for record in fresh:
                shown.add(record.id)
                if walker is not None:
                    if not walker.handle(record):
                        return
                elif json_out:
                    print(json_line(record.to_dict()), flush=True)
                else:
                    show(console, record)
            if not (watch_ or interactive):
                if not shown and not json_out:
                    console.print("[dim]no pending requests[/]")
                return
            if not fresh and not waiting:
                _note("waiting for approval requests... (Ctrl-C to stop)")
            waiting = not fresh
            time.sleep(0.3)
    except KeyboardInterrupt:
        pass


@app.command()
def approve(
    request_id: Annotated[str | None, typer.Argument(help="The request to approve.")] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Every pending request of --session or --batch.")
    ] = False,
    session: Annotated[
        str | None,
        typer.Option("--session", "-s", help="With --all: the session whose requests to approve."),
    ] = None,
    batch: Annotated[
        str | None,
        typer.Option("--batch", "-b", help="With --all: the batch whose requests to approve."),
    ] = None,
    kind: Annotated[
        str | None,
        typer.Option(help="With --all: only requests of this kind (code, shell, tool, subagent)."),
    ] = None,
    approver: As = None,
    redis_url: RedisUrl = None,
) -> None:
    """Approve a request (shows what is approved and sends its hash), or --all of a session
    or a batch."""
    if kind is not None and kind not in REQUEST_KINDS:
        raise typer.BadParameter(
            f"{kind!r} is not a request kind; use one of {', '.join(REQUEST_KINDS)}",
            param_hint="--kind",
        )
    _decide(redis_url, request_id, all_, session, kind, approver, reject_reason=None, batch=batch)


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
    batch: str | None = None,
) -> None:
    from actfleet.broker.approvals import DecisionRefused
    from actfleet.client.approval_prompt import show

    client = _connected(redis_url)
    console = Renderer().console
    try:
        if all_:
            if bool(session) == bool(batch) or request_id:
                raise _fail("--all needs one of --session S or --batch B, and no request id")
            if session:
                _existing(client, session)
            else:
                client.batch(batch)  # type: ignore[arg-type]
            records = [r for r in client.pending(session, batch=batch) if kind in (None, r.kind)]
        elif request_id:
            records = [client.request(request_id)]
        else:
            raise _fail(
                "name a request id (see actfleet approvals), or use --all --session S "
                "(or --all --batch B)"
            )
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
    except (DecisionRefused, LookupError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if failed:
        raise typer.Exit(EXIT_INPUT)


@app.command()
def cancel(
    session: Annotated[str, typer.Argument(help="The session to cancel.")],
    redis_url: RedisUrl = None,
) -> None:
    """Cancel a session: everything it runs stops, on whatever nodes it runs.

    Its model streams stop, its cells are interrupted, its pending approvals are withdrawn
    and its subagents end. An unknown session is refused (exit 3), nothing written."""
    from actfleet.client.sdk import UnknownSession

    try:
        _connected(redis_url).cancel(session)
    except (ValueError, UnknownSession) as exc:
        raise _fail(str(exc)) from None
    print(f"cancelling {session}")


def _local_time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


@app.command()
def sessions(
    limit: Limit = 20,
    json_out: Json = False,
    redis_url: RedisUrl = None,
) -> None:
    """List the most recently active sessions, with when each was last active."""
    for session_id, last in _connected(redis_url).sessions(limit):
        if json_out:
            print(json_line({"session_id": session_id, "last_active": last}))
        else:
            print(f"{_local_time(last)}  {session_id}")


@app.command("dead-letters")
def dead_letters(
    limit: Limit = 20,
    json_out: Json = False,
    redis_url: RedisUrl = None,
) -> None:
    """List the messages nodes could not read or run, newest first, with the reason.

    Bad queue messages, malformed step arguments, junk on the reply channels, broken
    records."""
    entries = _connected(redis_url).dead_letters(limit)
    for entry in entries:
        if json_out:
            print(json_line(entry))
            continue
        when = _local_time(float(entry.get("ts") or 0))
        print(f"{when}  {entry.get('source', '?')}  {entry.get('reason', '')}")
        if entry.get("preview"):
            print(f"    {entry['preview'][:120]!r} ({entry.get('size', '?')} bytes)")
    if not entries and not json_out:
        print("no dead letters")


@app.command()
def demo(
    redis_url: RedisUrl = None,
) -> None:
    """Run the bundled examples on this machine: a private Redis and two worker nodes.

    A private Redis (unless --redis-url), two worker nodes, the bundled example prompts
    with bundled replay files, live events, a results table."""
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
