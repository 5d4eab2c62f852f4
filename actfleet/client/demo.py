"""`actfleet demo`: the whole system on one machine, started and stopped by one command.

Starts a private redis-server with a password on a free port (or uses the Redis given by
--redis-url or ACTFLEET_REDIS_URL); starts two worker nodes with sandboxed kernels; submits
the bundled example prompts (replayed model responses, so no provider key is needed) as one
batch; shows every event live; prints a table. The nodes offer the example MCP server
(`examples/mcp/units.py`, configured by `examples/mcp/mcp.json`) to the examples that name it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import redis
from rich import box
from rich.console import Console
from rich.table import Table

from actfleet.broker import events as ev
from actfleet.broker.settings import Settings
from actfleet.client.local_redis import RedisServerMissing, private_redis
from actfleet.client.render import Renderer
from actfleet.client.sdk import Client

NODES = ("demo-1", "demo-2")


@dataclass
class Example:
    title: str
    replay: Path
    prompts: list[str]
    tools: list[str] = field(default_factory=list)
    """The MCP servers the example's turns may use."""
    session_id: str = ""
    nodes: set[str] = field(default_factory=set)
    results: list[ev.Event] = field(default_factory=list)
    cells: int = 0
    submitted: float = 0.0
    """Wall-clock time of the submission; the elapsed time runs to the last terminal event."""


def run_demo(redis_url: str | None) -> int:
    console = Console(highlight=False)
    with ExitStack() as stack:
        url = _redis(redis_url, console, stack)
        if url is None:
            return 3
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="actfleet-demo-")))
        stack.enter_context(_nodes(url, workdir, console))
        client = Client(url)
        return _run_examples(client, workdir, console)
    return 0


def _redis(url: str | None, console: Console, stack: ExitStack) -> str | None:
    """The Redis the user gave, else a private one we start and stop."""
    if url is not None:
        try:
            redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
        except redis.RedisError as exc:
            console.print(f"[red]error:[/] Redis at {url.split('@')[-1]} does not answer ({exc})")
            return None
        console.print(f"[dim]using Redis at {url.split('@')[-1]}[/]")
        return url
    try:
        base = stack.enter_context(private_redis())
    except RedisServerMissing as exc:
        console.print(f"[red]error:[/] {exc}, or give a Redis with --redis-url")
        return None
    console.print(f"[dim]started a private redis-server at {base.split('@')[-1]}[/]")
    return f"{base}/0"


@contextmanager
def _nodes(url: str, workdir: Path, console: Console) -> Iterator[None]:
    env = {
        **os.environ,
        "ACTFLEET_REDIS_URL": url,
        "ACTFLEET_WORKDIR": str(workdir),
        "ACTFLEET_WARM_KERNELS": "2",
        "ACTFLEET_MCP_CONFIG": str(example_mcp_config(workdir)),
    }
    procs = {}
    r = redis.Redis.from_url(url)
    prefix = Settings.from_env().key_prefix
    try:
        for name in NODES:
            log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the node
            procs[name] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "actfleet",
                    "worker",
                    "--name",
                    name,
                    "--concurrency",
                    "4",
                    "--kernels",
                    "4",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        with console.status("starting two worker nodes..."):
            for name, proc in procs.items():

                def up(name: str = name, proc: subprocess.Popen[bytes] = proc) -> bool:
                    if proc.poll() is not None:
                        log = (workdir / f"{name}.log").read_text(errors="replace")
                        raise RuntimeError(f"node {name} exited:\n{log[-3000:]}")
                    return bool(r.exists(f"{prefix}:node:{name}"))

                _until(up, 60, f"node {name} to come up")
        console.print(f"[dim]nodes up: {', '.join(NODES)}[/]")
        yield
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        console.print("[dim]nodes stopped[/]")


def example_mcp_config(workdir: Path) -> Path:
    """The example `mcpServers` file, its `python` commands made this interpreter's (the
    one actfleet and `mcp` are installed in, which `python` on PATH need not be)."""
    config = json.loads((files("actfleet") / "examples" / "mcp" / "mcp.json").read_text())
    for server in config["mcpServers"].values():
        if server.get("command") == "python":
            server["command"] = sys.executable
    path = workdir / "mcp.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def _until(predicate, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _load_examples() -> list[Example]:
    root = files("actfleet") / "examples"
    manifest = json.loads((root / "demo.json").read_text())
    return [
        Example(
            item["title"],
            Path(str(root / item["replay"])),
            list(item["prompts"]),
            list(item.get("tools", [])),
        )
        for item in manifest
    ]


def _run_examples(client: Client, workdir: Path, console: Console) -> int:
    examples = _load_examples()
    console.rule("[bold]actfleet demo[/] · model responses replayed from bundled files")
    # One batch: every example's first turn and its follow-ups are enqueued at once; a
    # session runs its turns in order, the sessions run in parallel on both nodes.
    for example in examples:
        example.submitted = time.time()
        handle = client.submit(
            example.prompts[0],
            model=f"replay:{example.replay}",
            approval="auto",
            tools=example.tools,
        )
        example.session_id = handle.session_id
        for prompt in example.prompts[1:]:
            client.submit(
                prompt,
                model=f"replay:{example.replay}",
                session_id=handle.session_id,
                approval="auto",
                tools=example.tools,
            )
    for example in examples:
        console.rule(f"[bold cyan]{example.title}[/] · session {example.session_id}")
        renderer = Renderer(console)
        for event in client.events(example.session_id, follow=True):
            renderer.show(event)
            if event.node:
                example.nodes.add(event.node)
            if isinstance(event, ev.CodeExecutionOutput):
                example.cells += 1
            if isinstance(event, ev.TERMINAL) and event.agent_id == "main":
                example.results.append(event)
                if len(example.results) == len(example.prompts):
                    break
    failed = _summary(examples, console)
    return max(failed, _run_batch(client, workdir, console))


def _run_batch(client: Client, workdir: Path, console: Console) -> int:
    """The bundled batch: 50 items, each its own session, followed with a progress bar;
    results appended to a JSONL file as they finish."""
    from actfleet.client.batch_cli import follow

    items = Path(str(files("actfleet") / "examples" / "batch" / "items.jsonl"))
    console.rule("[bold cyan]A batch[/] · 50 items, at most 8 at once")
    batch = client.submit_batch(items, model="test", name=f"demo-{int(time.time())}", concurrency=8)
    out = workdir / "results.jsonl"
    follow(batch, out, bar=True)
    results = [json.loads(line) for line in out.read_text().splitlines()]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="first results", title_style="bold")
    for column in ("custom_id", "status", "response"):
        table.add_column(column, no_wrap=column != "response")
    for result in results[:5]:
        table.add_row(result["custom_id"], result["status"], result["response"])
    console.print(table)
    console.print(
        f"{len(results)} results, one JSON line per item: [bold]actfleet batch run FILE -m "
        "MODEL -o OUT.jsonl[/] writes them to a file (README, section Batches)."
    )
    return 0 if {r["status"] for r in results} == {"completed"} else 1


def _summary(examples: list[Example], console: Console) -> int:
    table = Table(
        title="results",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for column in ("example", "session", "turns", "cells", "nodes", "secs", "status"):
        table.add_column(
            column,
            no_wrap=column in ("session", "status"),
            min_width={"example": 14, "status": 8}.get(column),
        )
    failures = 0
    for e in examples:
        ok = all(isinstance(r, ev.TurnFinished) for r in e.results)
        failures += not ok
        table.add_row(
            e.title,
            e.session_id,
            str(len(e.results)),
            str(e.cells),
            ", ".join(sorted(e.nodes)),
            f"{e.results[-1].ts - e.submitted:.1f}",
            "[green]finished[/]" if ok else "[red]failed[/]",
        )
    console.print(table)
    console.print(
        "Every session's events are in its Redis stream: [bold]actfleet watch SESSION "
        "--no-follow[/] shows them again. The demo's private Redis stops with it; give "
        "[bold]--redis-url[/] to keep the sessions in yours."
    )
    return 1 if failures else 0
