"""The client commands of the `actfleet` CLI: run, submit, watch, demo."""

from __future__ import annotations

import signal
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


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="What the agent should do.")],
    model: Model,
    session: Session = None,
    json_out: Json = False,
    timeout: Annotated[
        float | None, typer.Option(help="Give up after this many seconds (exit 2).")
    ] = None,
    redis_url: RedisUrl = None,
) -> None:
    """Submit a turn and stream the session's events until it ends.

    Exit 0 when the turn finished, 1 when it failed or was cancelled, 2 on timeout."""
    from actfleet.broker.events import TurnFinished
    from actfleet.client.sdk import RedisUnavailable, is_terminal_for

    client = _client(redis_url)
    try:
        client.ping()
        cursor = client.last_event_id(session) if session else "0-0"
        handle = client.submit(prompt, model=model, session_id=session)
    except (ValueError, RedisUnavailable) as exc:
        raise _fail(str(exc)) from None
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
    redis_url: RedisUrl = None,
) -> None:
    """Submit a turn and print its session id at once."""
    from actfleet.client.sdk import RedisUnavailable

    try:
        handle = _client(redis_url).submit(prompt, model=model, session_id=session)
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
    from actfleet.client.sdk import RedisUnavailable

    client = _client(redis_url)
    try:
        client.ping()
    except RedisUnavailable as exc:
        raise _fail(str(exc)) from None
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
def demo(
    redis_url: RedisUrl = None,
) -> None:
    """The main job on a fresh machine: Redis (private if none answers), two worker nodes,
    the bundled example prompts with bundled replay files, live events, a results table."""
    from actfleet.client.demo import run_demo

    raise typer.Exit(run_demo(redis_url))
