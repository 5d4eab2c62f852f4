"""The `actfleet` command: the client commands plus `actfleet worker`, which starts a node.
Worker code is imported only when a node starts, so the client commands stay light."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated

import typer

from actfleet.client.batch_cli import batch_app
from actfleet.client.cli import RedisUrl, app

app.add_typer(batch_app, name="batch")

LOGLEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@app.command()
def worker(
    name: Annotated[str | None, typer.Option(help="Node name (default: host-pid).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Steps run at once.")] = 8,
    kernels: Annotated[int, typer.Option(min=1, help="Agents (kernels) held at most.")] = 8,
    loglevel: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    no_sandbox: Annotated[
        bool, typer.Option("--no-sandbox", help="Run kernels unconfined (docs/security.md).")
    ] = False,
    allow_open_redis: Annotated[
        bool,
        typer.Option(
            "--allow-open-redis",
            help="Start against a Redis that needs no password though kernels have network.",
        ),
    ] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Start a worker node in the foreground; SIGTERM drains it gracefully.

    The node runs agents' model steps and their tools: execute_ipython_cell (code in the
    agent's sandboxed kernel) and, for main agents, subagent_task (a subagent, run as its
    own task on any node). It refuses to start (exit 3, saying why) where bubblewrap
    cannot confine kernels, or against a Redis without a password while kernels have
    network."""
    if loglevel.upper() not in LOGLEVELS:
        raise typer.BadParameter(
            f"{loglevel!r} is not a log level; use one of {', '.join(LOGLEVELS)}",
            param_hint="--loglevel",
        )
    if redis_url:
        from actfleet.client.cli import _client

        _client(redis_url).close()  # a URL that is not one is a one-line error, here
        os.environ["ACTFLEET_REDIS_URL"] = redis_url

    from actfleet.workers.main import run_worker

    node = name or f"{socket.gethostname()}-{os.getpid()}"
    raise typer.Exit(
        run_worker(
            node,
            concurrency,
            kernels,
            loglevel.upper(),
            sandbox=not no_sandbox,
            allow_open_redis=allow_open_redis,
        )
    )


@app.command()
def dashboard(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8765,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Show everything; no decisions, no cancel.")
    ] = False,
    token_file: Annotated[
        Path | None,
        typer.Option(help="A file holding the access token (else ACTFLEET_DASHBOARD_TOKEN)."),
    ] = None,
    basic_auth_file: Annotated[
        Path | None,
        typer.Option(
            help="A file of user:password lines for basic auth (else "
            "ACTFLEET_DASHBOARD_BASIC_AUTH=user:password[,...])."
        ),
    ] = None,
    redis_url: RedisUrl = None,
) -> None:
    """Serve the web dashboard: fleet, sessions, live session pages, approvals.

    Bound to 127.0.0.1 (the default) it needs no login and records the OS user as the
    approver. Bound elsewhere it needs a token or basic auth on every request (the
    approver is the logged-in name), and refuses to start without one (exit 3).
    ACTFLEET_FLOWER_URL puts a link to Flower in its navigation."""
    from actfleet.client.cli import _connected, _fail
    from actfleet.dashboard.auth import Auth, AuthConfigError

    try:
        auth = Auth.load(
            token=os.environ.get("ACTFLEET_DASHBOARD_TOKEN", ""),
            token_file=token_file,
            basic=os.environ.get("ACTFLEET_DASHBOARD_BASIC_AUTH", ""),
            basic_file=basic_auth_file,
        )
        auth.check_bind(host)
    except AuthConfigError as exc:
        raise _fail(str(exc)) from None
    client = _connected(redis_url)
    from actfleet.dashboard.app import DashboardConfig, serve

    flower_url = os.environ.get("ACTFLEET_FLOWER_URL", "")
    serve(client, DashboardConfig(auth, read_only, flower_url), host, port)


def main() -> None:
    app()
