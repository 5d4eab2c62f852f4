"""The node's MCP server processes and connections, through the `mcp` client.

A server starts on first use (its tools listed and cached), is shared by the node's
runtimes (or started per runtime, `scope: runtime`), and stops with the node or runtime.
A call that finds its server gone (crashed, killed) reports the failure; the next call
starts the server again. Only the operator's configuration says what runs: callers name
a server, a tool and arguments, nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, PaginatedRequestParams, TextContent, Tool

from actfleet.workers.mcp_config import McpServerConfig

log = logging.getLogger("actfleet.mcp")

RuntimeKey = tuple[str, str]
"""(session id, agent id): whose runtime a per-runtime server belongs to."""


class McpServerError(RuntimeError):
    """A server did not start, or its connection was lost; the message names it."""


@dataclass(frozen=True)
class McpTool:
    """One tool of a server, as offered: the model sees it as `<server>_<tool>`."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None

    @property
    def full_name(self) -> str:
        return f"{self.server}_{self.name}"


@dataclass(frozen=True)
class McpResult:
    """What a tool call returned: its text, its structured content, and whether the
    server said it failed."""

    text: str
    structured: Any = None
    is_error: bool = False


class _Connection:
    """One running server and its client session, held open by a task of its own (the
    `mcp` client's task groups must be entered and left in one task)."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.session: ClientSession | None = None
        self.tools: list[McpTool] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        config = self.config
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._hold(ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), config.init_timeout)
        except TimeoutError:
            await self.close()
            raise McpServerError(
                f"MCP server {config.name!r} did not start within {config.init_timeout:g} s "
                "(raise its init_timeout in the MCP config)"
            ) from None
        except McpServerError:
            await self.close()
            raise

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                self.tools = await _list_tools(session, self.config)
                self.session = session
                ready.set_result(None)
                await self._stop.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the task groups of the client raise groups
            if not ready.done():
                hint = " (its stderr is in the node's log)" if self.config.command else ""
                ready.set_exception(
                    McpServerError(
                        f"MCP server {self.config.name!r} failed to start: {_why(exc)}{hint}"
                    )
                )
            else:
                log.warning("MCP server %s stopped: %s", self.config.name, _why(exc))
        finally:
            self.session = None

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        config = self.config
        if config.transport == "http":
            client = httpx2.AsyncClient(
                headers=dict(config.headers), timeout=httpx2.Timeout(30.0, read=300.0)
            )
            return streamable_http_client(config.url, http_client=client)
        parameters = StdioServerParameters(
            command=config.command,
            args=list(config.args),
            env=dict(config.env) or None,
            cwd=config.cwd or None,
        )
        return stdio_client(parameters)

    @property
    def alive(self) -> bool:
        return self.session is not None and self._task is not None and not self._task.done()

    async def close(self) -> None:
        self._stop.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 10)
        except TimeoutError:
            self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


@dataclass
class McpServers:
    """Every configured server of a node, started lazily: one connection per server
    (scope node) or per server and runtime (scope runtime)."""

    configs: dict[str, McpServerConfig] = field(default_factory=dict)
    _connections: dict[tuple[str, RuntimeKey | None], _Connection] = field(default_factory=dict)
    _starting: dict[tuple[str, RuntimeKey | None], asyncio.Lock] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return sorted(self.configs)

    async def tools(self, server: str, runtime: RuntimeKey) -> list[McpTool]:
        """The server's tools (started if it is not running; the list is cached)."""
        return (await self._connection(server, runtime)).tools

    async def call(
        self, server: str, tool: str, arguments: dict[str, Any], runtime: RuntimeKey, timeout: float
    ) -> McpResult:
        """Call a tool of a configured server. A server that is gone raises
        McpServerError (and is started again for the next call)."""
        key = self._key(server, runtime)
        connection = await self._connection(server, runtime)
        session = connection.session
        if session is None or not connection.alive:
            self._drop(key, connection)
            raise McpServerError(f"MCP server {server!r} had stopped; it restarts on the next call")
        try:
            result = await session.call_tool(tool, arguments, read_timeout_seconds=timeout)
        except Exception as exc:
            if not connection.alive or "closed" in str(exc).lower():
                self._drop(key, connection)
                raise McpServerError(
                    f"MCP server {server!r} stopped during the call ({_why(exc)}); it restarts "
                    "on the next call"
                ) from None
            raise
        return _result(result)

    async def release_runtime(self, runtime: RuntimeKey) -> None:
        """Stop the per-runtime servers of a runtime being released."""
        for key in [k for k in self._connections if k[1] == runtime]:
            await self._connections.pop(key).close()

    async def close(self) -> None:
        """Stop every server (the node stops)."""
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)

    def _key(self, server: str, runtime: RuntimeKey) -> tuple[str, RuntimeKey | None]:
        config = self.configs.get(server)
        if config is None:
            raise McpServerError(
                f"MCP server {server!r} is not configured on this node (it has: "
                f"{', '.join(self.names) or 'none'}); configure every node alike"
            )
        return server, (runtime if config.scope == "runtime" else None)

    async def _connection(self, server: str, runtime: RuntimeKey) -> _Connection:
        key = self._key(server, runtime)
        async with self._starting.setdefault(key, asyncio.Lock()):
            connection = self._connections.get(key)
            if connection is None:
                connection = _Connection(self.configs[server])
                await connection.start()
                self._connections[key] = connection
                log.info("MCP server %s started (%d tools)", server, len(connection.tools))
            return connection

    def _drop(self, key: tuple[str, RuntimeKey | None], connection: _Connection) -> None:
        if self._connections.get(key) is connection:
            del self._connections[key]
        asyncio.ensure_future(connection.close())


async def _list_tools(session: ClientSession, config: McpServerConfig) -> list[McpTool]:
    tools: list[Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(
            params=PaginatedRequestParams(cursor=cursor) if cursor else None
        )
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return [
        McpTool(
            server=config.name,
            name=tool.name,
            description=tool.description or "",
            input_schema=dict(tool.input_schema or {"type": "object", "properties": {}}),
            output_schema=dict(tool.output_schema) if tool.output_schema else None,
        )
        for tool in tools
        if tool.name not in config.exclude_tools
    ]


def _result(result: CallToolResult) -> McpResult:
    parts = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type} content: {getattr(block, 'mime_type', '') or 'binary'}]")
    return McpResult("\n".join(parts), result.structured_content, bool(result.is_error))


def _why(exc: BaseException) -> str:
    """The innermost readable reason of an exception (the client wraps them in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
