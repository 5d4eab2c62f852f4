"""The `actfleet` command: the client commands plus `actfleet worker`, which starts a node.
Worker code is imported only when a node starts, so the client commands stay light."""

from __future__ import annotations

import socket
from typing import Annotated

import typer

from actfleet.client.cli import RedisUrl, app

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
    import os

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


def main() -> None:
    app()
