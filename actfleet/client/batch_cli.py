"""`actfleet batch ...`: submit a JSONL file of items, follow it with a progress bar, write
its results as they finish; status, results, cancel and list from any machine."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from actfleet.client.cli import (
    EXIT_COMPLETED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_STOPPED,
    Approve,
    Json,
    Limit,
    MaxTurns,
    Model,
    RedisUrl,
    Tools,
    _connected,
    _fail,
    _local_time,
    _note,
    _tool_names,
)

if TYPE_CHECKING:
    from actfleet.client.batch import Batch, BatchProgress

batch_app = typer.Typer(
    help="Batches: a JSONL file of items (custom_id, prompt, ...) worked through by the fleet.",
    no_args_is_help=True,
)

EXIT_CODES = (
    "Exit codes: 0 every item completed; 1 an item failed, was cancelled or timed out, or "
    "the batch stopped on an error; 3 bad input; 4 items were rejected or stopped by "
    "--max-turns or the budget; 130 Ctrl-C (the batch goes on)."
)

File = Annotated[
    Path,
    typer.Argument(
        help="JSONL: one item per line: custom_id, prompt, and optionally "
        "model, approval, max_turns, session_id, metadata."
    ),
]
Name = Annotated[
    str | None,
    typer.Option(help="The batch's name (default: the file's stem); the same name resumes."),
]
Concurrency = Annotated[int, typer.Option(min=1, help="Items running at once, at most.")]
Retries = Annotated[
    int | None, typer.Option(min=0, help="Retries of a transient provider error per model step.")
]
ItemTimeout = Annotated[
    float, typer.Option(min=0, help="Seconds an item may run before it is cancelled (0: none).")
]
MaxCost = Annotated[
    float, typer.Option(min=0, help="USD the whole batch may spend; then nothing new starts.")
]
MaxTokens = Annotated[
    int, typer.Option(min=0, help="Tokens the whole batch may use; then nothing new starts.")
]
ItemMaxCost = Annotated[
    float | None, typer.Option(min=0, help="USD one item may spend; then it ends `budget`.")
]
ItemMaxTokens = Annotated[
    int | None, typer.Option(min=1, help="Tokens one item may use; then it ends `budget`.")
]
BatchId = Annotated[str, typer.Argument(help="The batch id (b-<name>; see actfleet batch list).")]
Out = Annotated[
    Path | None, typer.Option("--output", "-o", help="Append results to this JSONL file.")
]


SUBMIT_OPTIONS = (
    "concurrency",
    "approve",
    "max_turns",
    "retries",
    "item_timeout",
    "max_cost",
    "max_tokens",
    "item_max_cost",
    "item_max_tokens",
    "tools",
)
"""The options `batch run` and `batch submit` share, by their parameter names."""


def _options(given: dict[str, Any]) -> dict[str, Any]:
    """The shared options from a command's parameters, as `submit_batch` takes them."""
    options = {name: given[name] for name in SUBMIT_OPTIONS}
    options["approval"] = options.pop("approve")
    options["tools"] = _tool_names(options["tools"])
    return options


def _submit(
    redis_url: str | None, file: Path, model: str, name: str | None, options: dict[str, Any]
) -> Batch:
    from actfleet.broker.batches import BatchFileError
    from actfleet.client.sdk import RedisUnavailable

    client = _connected(redis_url)
    try:
        return client.submit_batch(file, model=model, name=name, **options)
    except (BatchFileError, ValueError, RedisUnavailable) as exc:
        raise _fail(str(exc)) from None


@batch_app.command(epilog=EXIT_CODES)
def run(
    file: File,
    model: Model,
    output: Out = None,
    name: Name = None,
    concurrency: Concurrency = 32,
    approve: Approve = "auto",
    max_turns: MaxTurns = None,
    retries: Retries = None,
    item_timeout: ItemTimeout = 0.0,
    max_cost: MaxCost = 0.0,
    max_tokens: MaxTokens = 0,
    item_max_cost: ItemMaxCost = None,
    item_max_tokens: ItemMaxTokens = None,
    tools: Tools = None,
    redis_url: RedisUrl = None,
) -> None:
    """Submit a batch, then follow it with a progress bar, appending each result to
    --output as it finishes (default: <file>.results.jsonl).

    Running the same command again submits only what is missing and writes only missing
    results. Ctrl-C stops following, not the batch."""
    batch = _submit(redis_url, file, model, name, _options(locals()))
    out = output or file.with_name(f"{file.stem}.results.jsonl")
    resume = f"actfleet batch run {file} --model {model} --name {batch.record().name} -o {out}"
    try:
        follow(batch, out, bar=True)
    except KeyboardInterrupt:
        _note(
            f"stopped following; batch {batch.id} goes on. Resume with: {resume}  "
            f"(status: actfleet batch status {batch.id}; stop it: actfleet batch cancel {batch.id})"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(_exit_code(batch.progress()))


@batch_app.command()
def submit(
    file: File,
    model: Model,
    name: Name = None,
    concurrency: Concurrency = 32,
    approve: Approve = "auto",
    max_turns: MaxTurns = None,
    retries: Retries = None,
    item_timeout: ItemTimeout = 0.0,
    max_cost: MaxCost = 0.0,
    max_tokens: MaxTokens = 0,
    item_max_cost: ItemMaxCost = None,
    item_max_tokens: ItemMaxTokens = None,
    tools: Tools = None,
    redis_url: RedisUrl = None,
) -> None:
    """Submit a batch and print its id (follow it with actfleet batch watch ID)."""
    batch = _submit(redis_url, file, model, name, _options(locals()))
    print(batch.id)


@batch_app.command()
def status(batch_id: BatchId, json_out: Json = False, redis_url: RedisUrl = None) -> None:
    """A batch's counts per status, usage, cost, rate and ETA."""
    progress = _batch(redis_url, batch_id).progress()
    if json_out:
        print(json.dumps(progress.to_dict()))
    else:
        print(_summary(progress))


@batch_app.command()
def watch(batch_id: BatchId, redis_url: RedisUrl = None) -> None:
    """Follow a batch's progress until it ends (Ctrl-C stops following only)."""
    batch = _batch(redis_url, batch_id)
    try:
        follow(batch, None, bar=True)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(_exit_code(batch.progress()))


@batch_app.command()
def results(
    batch_id: BatchId,
    output: Out = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Wait for more until done.")
    ] = False,
    redis_url: RedisUrl = None,
) -> None:
    """The batch's results, one JSON line per item in completion order: to stdout, or
    appended to --output (results already in that file are not written again)."""
    batch = _batch(redis_url, batch_id)
    try:
        if output is None:
            for _, result in batch.results(follow=follow):
                print(json.dumps(result), flush=True)
        else:
            written = _Writer(output)
            for _, result in batch.results(follow=follow):
                written.add(result)
            _note(f"{written.count} new results in {output}")
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None


@batch_app.command()
def cancel(batch_id: BatchId, redis_url: RedisUrl = None) -> None:
    """Stop a batch: nothing new starts, queued items end cancelled, running ones are
    cancelled."""
    _batch(redis_url, batch_id).cancel()
    print(f"cancelling {batch_id}")


@batch_app.command("list")
def list_(
    limit: Limit = 20,
    json_out: Json = False,
    redis_url: RedisUrl = None,
) -> None:
    """The most recent batches, newest first."""
    for record in _connected(redis_url).batches(limit):
        if json_out:
            print(
                json.dumps(
                    {
                        "batch": record.id,
                        "status": record.status,
                        "total": record.total,
                        "ended": record.ended,
                        "created_at": record.created_at,
                    }
                )
            )
        else:
            print(
                f"{_local_time(record.created_at)}  {record.id}  {record.status}  "
                f"{record.ended}/{record.total}"
            )


def _batch(redis_url: str | None, batch_id: str) -> Batch:
    from actfleet.client.batch import UnknownBatch

    try:
        return _connected(redis_url).batch(batch_id)
    except (UnknownBatch, ValueError) as exc:
        raise _fail(str(exc)) from None


class _Writer:
    """Appends results to a JSONL file, one whole line per write, skipping custom_ids the
    file has (a line cut off by a crash is dropped first, and written again)."""

    def __init__(self, path: Path):
        self.path, self.count = path, 0
        self.seen: set[str] = set()
        if path.exists():
            data = path.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]
            if len(whole) != len(data):
                with path.open("r+b") as handle:
                    handle.truncate(len(whole))
            for line in whole.splitlines():
                try:
                    self.seen.add(str(json.loads(line)["custom_id"]))
                except (ValueError, KeyError, TypeError):
                    raise _fail(
                        f"{path} holds a line that is not a result; give another --output"
                    ) from None
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def add(self, result: dict) -> None:
        if result["custom_id"] in self.seen:
            return
        os.write(self.fd, (json.dumps(result) + "\n").encode())
        self.seen.add(result["custom_id"])
        self.count += 1


def follow(batch: Batch, out: Path | None, *, bar: bool) -> None:
    """Show progress until the batch ends; with `out`, write results as they come."""
    from rich.console import Console, Group
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.text import Text

    writer = _Writer(out) if out is not None else None
    console = Console(stderr=True)
    cursor = "0-0"
    bar_row = Progress(
        TextColumn("{task.description}"), BarColumn(bar_width=30), MofNCompleteColumn()
    )
    task = bar_row.add_task(batch.id, total=None)
    stats = Text()
    last_pump = 0.0
    with Live(
        Group(bar_row, stats), console=console, transient=not bar, auto_refresh=False
    ) as live:
        while True:
            if writer is not None:
                for seen, result in batch.results(cursor):
                    writer.add(result)
                    cursor = seen
            progress = batch.progress()
            bar_row.update(task, total=progress.record.total, completed=progress.record.ended)
            stats.plain = _line(progress)
            live.refresh()
            if progress.finished and (writer is None or batch.all_read(cursor)):
                break
            if time.monotonic() - last_pump > 5:
                batch.pump()  # nodes pump too; this covers a fleet that lost one
                last_pump = time.monotonic()
            time.sleep(0.5)
    if not console.is_terminal:
        console.line()
    console.print(_summary(progress))
    if writer is not None:
        console.print(f"[dim]{writer.count} new results appended to {out}[/]")
    if progress.record.error:
        console.print(f"[red]{progress.record.error}[/]")


def _money(progress: BatchProgress) -> str:
    r = progress.record
    if r.cost_unknown:
        return "cost unknown"
    return f"≥ ${r.cost:.4f} ({r.unpriced} requests unpriced)" if r.unpriced else f"${r.cost:.4f}"


def _line(progress: BatchProgress) -> str:
    c = progress.record.counts
    failed = c["failed"] + c["cancelled"] + c["timeout"]
    other = c["rejected"] + c["max_turns"] + c["budget"]
    eta = f"ETA {progress.eta:.0f}s" if progress.eta is not None else "ETA -"
    tokens = progress.record.usage["input_tokens"] + progress.record.usage["output_tokens"]
    return (
        f"done {c['completed']} · failed {failed} · other {other} · running {progress.running}"
        f" · approval {progress.parked} · queued {progress.queued}\n"
        f"{progress.rate:.1f} items/s · {eta} · {tokens:,} tokens · {_money(progress)}"
    )


def _summary(progress: BatchProgress) -> str:
    r = progress.record
    counts = ", ".join(f"{n} {s}" for s, n in r.counts.items() if n)
    return (
        f"batch {r.id} {r.status}: {r.ended}/{r.total} ended ({counts or 'none yet'}); "
        f"running {progress.running}, waiting for approval {progress.parked}, queued "
        f"{progress.queued}; {r.usage['input_tokens'] + r.usage['output_tokens']:,} tokens, "
        f"{_money(progress)}"
    )


def _exit_code(progress: BatchProgress) -> int:
    c = progress.record.counts
    if progress.record.status == "stopped" or c["failed"] or c["cancelled"] or c["timeout"]:
        return EXIT_FAILED
    if c["rejected"] or c["max_turns"] or c["budget"] or progress.record.status == "budget":
        return EXIT_STOPPED
    return EXIT_COMPLETED
