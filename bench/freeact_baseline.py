"""freeact baseline: the job of batch_throughput.py (N items, each a fresh session whose
scripted model runs one cell `print(6 * 7)` and then answers "42") run as a freeact user
would: one asyncio process, one `freeact.Agent` per item (its own kernel gateway, kernel
and freeact's built-in MCP servers), at most --cap at a time, every action approved.
An item fails if its agent does not start, its cell does not print 42 or it does not
answer 42; the first error is printed with its causes.

freeact needs its own venv (ipybox 0.9 wants mcp<2, so pydantic-ai 1.x, whose MCP client
works with it); from the repo root:

    python3.11 -m venv .bench-freeact
    .bench-freeact/bin/pip install freeact 'mcp<2' 'pydantic-ai<2'
    .bench-freeact/bin/python bench/freeact_baseline.py [--items 100] [--cap 4] [--timeout 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
from freeact.agent import Agent, ApprovalRequest, CodeExecutionOutput, Response
from freeact.agent.config import (
    BASIC_SEARCH_MCP_SERVER_CONFIG,
    FILESYSTEM_MCP_SERVER_CONFIG,
    Config,
)
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

CELL = "print(6 * 7)"


async def scripted_model(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
    """First the code action, then (once the cell's result is in) the answer."""
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in last.parts):
        yield "42"
    else:
        args = json.dumps({"code": CELL})
        yield {0: DeltaToolCall(name="ipybox_execute_ipython_cell", json_args=args)}


async def run_item(config: Config, index: int) -> None:
    """One session: start an agent, run its turn with every action approved, stop it."""
    output = answer = None
    async with Agent(config=config) as agent:
        async for event in agent.stream(f"item {index}"):
            match event:
                case ApprovalRequest():
                    event.approve(True)
                case CodeExecutionOutput(text=text):
                    output = text
                case Response(content=content):
                    answer = content
    if (output or "").strip() != "42" or answer != "42":
        raise RuntimeError(f"cell output {output!r}, answer {answer!r}")


def describe(error: BaseException) -> str:
    """The error and its causes (freeact wraps a failed start in a bare RuntimeError)."""
    parts = []
    cause: BaseException | None = error
    while cause is not None:
        parts.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    return " <- ".join(parts)


async def run_all(config: Config, items: int, cap: int, timeout: float) -> list[str]:
    """Every item under the cap; the errors of those that failed."""
    gate = asyncio.Semaphore(cap)

    async def guarded(index: int) -> str | None:
        async with gate:
            try:
                await asyncio.wait_for(run_item(config, index), timeout)
            except TimeoutError:
                return f"timed out after {timeout:.0f} s"
            except Exception as error:
                return describe(error)
            return None

    results = await asyncio.gather(*(guarded(i) for i in range(items)))
    return [error for error in results if error is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=300, help="seconds per item")
    args = parser.parse_args()

    # freeact's built-in tool-search MCP server is started as `python -m ...`: put this
    # venv's python first on PATH, as an activated venv would.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    with tempfile.TemporaryDirectory(prefix="bench-freeact-") as project:
        os.chdir(project)  # freeact's filesystem MCP server serves the current directory
        config = Config(
            working_dir=Path(project),
            model=FunctionModel(stream_function=scripted_model),
            model_settings={},
            ptc_servers={},
            # freeact's built-in MCP servers, with 60 s instead of pydantic-ai's 5 s to start:
            # with 4 agents starting at once on 2 cores, 5 s fails most starts.
            mcp_servers={
                "pytools": {**BASIC_SEARCH_MCP_SERVER_CONFIG, "timeout": 60},
                "filesystem": {**FILESYSTEM_MCP_SERVER_CONFIG, "timeout": 60},
            },
        )
        started = time.perf_counter()
        try:
            errors = asyncio.run(run_all(config, args.items, args.cap, args.timeout))
        finally:
            for child in psutil.Process().children(recursive=True):
                child.kill()
        elapsed = time.perf_counter() - started
    first = f" (first: {errors[0]})" if errors else ""
    print(
        f"freeact: {args.items} items, cap {args.cap}: {elapsed:.1f} s, "
        f"{args.items / elapsed:.2f} sessions/s, {len(errors)} failed{first}"
    )


if __name__ == "__main__":
    main()
