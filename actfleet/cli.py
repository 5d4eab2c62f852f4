"""The `actfleet` command: the client commands plus `actfleet worker`, which starts a node.
Worker code is imported only when a node starts, so the client commands stay light."""

from __future__ import annotations

import socket
from typing import Annotated

import typer

from actfleet.client.cli import app


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
) -> None:
    """Start a worker node in the foreground; SIGTERM drains it gracefully."""
    import os

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
