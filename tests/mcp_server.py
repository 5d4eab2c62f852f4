"""A small real MCP stdio server for the tests (the `mcp` package's server API).

`MCP_TEST_INIT_DELAY` seconds of sleep before serving stand for a slow server;
`MCP_TEST_FAIL` makes it exit at once, a server that cannot start.
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("testtools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def greet(name: str, punctuation: str = "!") -> str:
    """Greet someone by name."""
    return f"hello {name}{punctuation}"


@server.tool()
def repeat(text: str, times: int) -> str:
    """`text` repeated `times` times."""
    return text * times


@server.tool()
def fail(message: str) -> str:
    """Always fails with the given message."""
    raise ToolError(message)


@server.tool()
def pid() -> int:
    """The server process's id."""
    return os.getpid()


@server.tool()
def secret() -> str:
    """An excluded tool: never offered."""
    return "never"


if __name__ == "__main__":
    if os.environ.get("MCP_TEST_FAIL"):
        print("test server refuses to start", file=sys.stderr)
        sys.exit(2)
    time.sleep(float(os.environ.get("MCP_TEST_INIT_DELAY", "0")))
    server.run()
