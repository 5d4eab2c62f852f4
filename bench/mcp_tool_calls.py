"""MCP tool calls, both ways, through a private Redis and one worker offering the example
units server (`actfleet/examples/mcp/units.py`, configured as `actfleet demo` does).

- JSON call: a turn of N model responses, each one `units_convert` JSON tool call. Round
  trip: ToolCall (the model step committed the call) -> ToolOutput (the execution step
  committed the result), both stamped by the worker; and per step, ToolOutput -> next
  ToolOutput (a whole model step + execution step).
- Programmatic call: a turn of N cells, each making one `convert(...)` call through the
  generated `mcptools` module: CodeAction -> CodeExecutionOutput, beside the same turn with
  the call replaced by a constant (so the difference is the call's cost).
- Throughput: cells each making 100 programmatic calls in a loop, timed inside the cell.

Policy `auto` (each call still goes through the policy, which allows it); the server is
started and the kernel warmed by a first turn.

    .venv/bin/python bench/mcp_tool_calls.py [--calls 50] [--batch 100] [--cells 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from _fleet import Fleet, pct

from actfleet.broker.events import (
    CodeAction,
    CodeExecutionOutput,
    Event,
    ToolCall,
    ToolOutput,
    TurnFinished,
)
from actfleet.client import Client
from actfleet.client.demo import example_mcp_config

IMPORT = "from mcptools.units.convert import run as convert\n"
ONE_CALL = "print(convert(value=26.2, from_unit='mi', to_unit='km'))"
NO_CALL = "print(42.164813)"
JSON_CALL = {
    "name": "units_convert",
    "args": {"value": 26.2, "from_unit": "mi", "to_unit": "km"},
}
LOOP = (
    "import time\n"
    "start = time.perf_counter()\n"
    "for i in range({n}):\n"
    "    convert(value=i, from_unit='mi', to_unit='km')\n"
    "print(time.perf_counter() - start)"
)


def write_replay(path: Path, lines: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in [*lines, {"text": "done"}]))
    return f"replay:{path}"


def run_turn(client: Client, model: str) -> list[Event]:
    """Run one turn with the units server; its events up to TurnFinished."""
    handle = client.submit("bench", model=model, approval="auto", tools=["units"])
    events: list[Event] = []
    for event in client.events(handle.session_id):
        events.append(event)
        if isinstance(event, CodeExecutionOutput) and event.status != "ok":
            raise RuntimeError(f"cell failed: {event.text}")
        if isinstance(event, ToolOutput) and event.content.startswith("MCP tool call failed"):
            raise RuntimeError(f"call failed: {event.content}")
        if isinstance(event, TurnFinished):
            return events
        if event.type in ("TurnFailed", "Cancelled", "ApprovalRequest"):
            raise RuntimeError(f"turn stopped: {event}")
    raise AssertionError("unreachable")


def stamps(events: list[Event], kind: type[Event]) -> list[float]:
    return [e.ts for e in events if isinstance(e, kind)]


def gaps(starts: list[float], ends: list[float]) -> list[float]:
    return [(b - a) * 1000 for a, b in zip(starts, ends, strict=True)]


def main(calls: int, batch: int, cells: int) -> None:
    fleet = Fleet("bench-mcp-", deadline=600)
    fleet.start_redis()
    config = example_mcp_config(fleet.dir)
    fleet.start_worker("bench-1", warm_kernels=2, ACTFLEET_MCP_CONFIG=str(config))
    try:
        client = Client(fleet.redis_url)
        d = fleet.dir
        warm = [{"tool_calls": [JSON_CALL]}, {"code": IMPORT + ONE_CALL}]
        run_turn(client, write_replay(d / "warm.jsonl", warm))  # server start, imports
        fleet.wait_warm("bench-1", 3)

        events = run_turn(
            client, write_replay(d / "json.jsonl", [{"tool_calls": [JSON_CALL]}] * calls)
        )
        json_rtt = gaps(stamps(events, ToolCall), stamps(events, ToolOutput))
        outputs = stamps(events, ToolOutput)
        json_step = [(b - a) * 1000 for a, b in zip(outputs, outputs[1:], strict=False)]

        code = [{"code": IMPORT + ONE_CALL}] * calls
        events = run_turn(client, write_replay(d / "code.jsonl", code))
        code_rtt = gaps(stamps(events, CodeAction), stamps(events, CodeExecutionOutput))
        baseline = [{"code": IMPORT + NO_CALL}] * calls
        events = run_turn(client, write_replay(d / "base.jsonl", baseline))
        base_rtt = gaps(stamps(events, CodeAction), stamps(events, CodeExecutionOutput))

        loop = [{"code": IMPORT + LOOP.format(n=batch)}] * cells
        events = run_turn(client, write_replay(d / "loop.jsonl", loop))
        seconds = [float(e.text.strip()) for e in events if isinstance(e, CodeExecutionOutput)]
        rates = [batch / s for s in seconds]
        client.close()
    finally:
        fleet.stop()

    def row(name: str, values: list[float]) -> str:
        return f"{name:<52}{pct(values, 50):>8.2f}{pct(values, 99):>8.2f}"

    print(f"MCP tool calls (example units server, stdio), 1 worker, {calls} calls each, ms")
    print(f"{'':<52}{'p50':>8}{'p99':>8}")
    print(row("JSON call: ToolCall -> ToolOutput", json_rtt))
    print(row("JSON call: per step (output -> next output)", json_step))
    print(row("programmatic: code action -> output, 1 call", code_rtt))
    print(row("same cell without the call", base_rtt))
    print(
        f"programmatic call's own cost (p50 difference): "
        f"{pct(code_rtt, 50) - pct(base_rtt, 50):.2f} ms"
    )
    print(
        f"{batch} programmatic calls in one cell, {cells} cells: "
        f"{statistics.median(rates):.0f} calls/s median "
        f"(min {min(rates):.0f}, max {max(rates):.0f}; "
        f"{statistics.median(seconds) * 1000 / batch:.2f} ms per call)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--cells", type=int, default=5)
    args = parser.parse_args()
    main(args.calls, args.batch, args.cells)
