"""The bridge that lets `!cmd` inside a kernel ask its node for approval.

ipybox's kernel init code replaces IPython's shell hooks with ones that call
`mcpygen.ApprovalRequestor('ipybox', host, port).request_sync('shell', {'cmd': ...})`,
an HTTP POST to an mcpygen `ToolServer`, which forwards it over a websocket to the
`ApprovalClient` connected to it and blocks until that client accepts or rejects.

Each kernel gets its own `ToolServer` (on 127.0.0.1, a free port) and `ApprovalClient`,
both running on the node's event loop. The request names no kernel (the server name is
fixed to `'ipybox'`), so the port a request arrives on is the only sound way to tell
which kernel asked; it needs no edits to ipybox's generated code, it is what ipybox's own
`CodeExecutor` does, and it matches the design's runtime (a kernel and its MCP servers
belong together). A server costs about 0.16 MB and ~20 ms to start, next to ~50 MB and
~0.6 s per kernel, and it outlives kernel restarts, so it is not wasteful.

The server's `/run` and `/reset` routes are removed: an approval callback cannot tell
`/approve` from `/run`, so code could otherwise get an approved `cmd` and have the node
start an arbitrary MCP server command with it. Only `/approve`, `/approval` (the
client's websocket) and `/status` (the readiness probe) remain.

ipybox's init code is applied unchanged, behind a short prelude that keeps the hooks'
`from mcpygen import ApprovalRequestor` from importing all of mcpygen (see `_LAZY_MCPYGEN`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from ipybox.kernel_mgr.init import build_init_code
from mcpygen import ApprovalClient, ApprovalRequest, ToolServer

__all__ = ("Decide", "ShellApprovals")

logger = logging.getLogger(__name__)

Decide = Callable[[str], Awaitable[bool]]
"""Decides one shell command of a kernel: `True` runs it, `False` rejects it."""

_HOST = "127.0.0.1"
_LAZY_MCPYGEN = """\
import importlib.util as _ilu, sys as _sys
if 'mcpygen' not in _sys.modules:
    _spec = _ilu.find_spec('mcpygen')
    _pkg = _ilu.module_from_spec(_spec)
    def _getattr(name, _pkg=_pkg, _spec=_spec):
        if name == 'ApprovalRequestor':
            from mcpygen.tool_exec.approval.client import ApprovalRequestor
            return ApprovalRequestor
        del _pkg.__getattr__
        _spec.loader.exec_module(_pkg)
        return getattr(_pkg, name)
    _pkg.__getattr__ = _getattr
    _sys.modules['mcpygen'] = _pkg
    del _spec, _pkg, _getattr
del _ilu, _sys
"""
"""Makes the hooks' `from mcpygen import ApprovalRequestor` import only that class's module.

A plain `import mcpygen` also imports its code generator, `mcp` and `jsonschema`: 3.5 s and
+80 MB per kernel on its first `!cmd` (measured), against 0.4 s and +8 MB for this. Any other
attribute of the package loads the whole package, as the plain import would.
"""
_KEPT_ROUTES = frozenset({"/approve", "/approval", "/status"})
_SHELL_TOOLS = frozenset({"shell", "shell_magic"})
"""What ipybox's hooks ask for: `!cmd` (and `!!cmd`) and `%%bash` / `%%sh` cells."""


class ShellApprovals:
    """One kernel's approval endpoint: every `!cmd` request reaching it goes to `decide`."""

    def __init__(self, decide: Decide) -> None:
        self._decide = decide
        self._server = ToolServer(
            host=_HOST,
            port=_free_port(),
            approval_required=True,
            log_to_stderr=True,
            log_level="WARNING",
        )
        self._server.ready_checks, self._server.ready_check_interval = 500, 0.01
        self._server.app.router.routes[:] = [
            route
            for route in self._server.app.router.routes
            if getattr(route, "path", None) in _KEPT_ROUTES
        ]
        self._client = ApprovalClient(self._on_request, host=_HOST, port=self._server.port)
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Start the server and connect its approval client."""
        await self._server.start()
        await self._client.connect()

    def init_code(self, working_dir: Path) -> str:
        """ipybox's kernel init code: cwd restore, the shell guard, and hooks asking this server."""
        return _LAZY_MCPYGEN + build_init_code(
            working_dir=working_dir,
            approve_shell_cmds=True,
            require_shell_escape=True,
            tool_server_host=_HOST,
            tool_server_port=self._server.port,
        )

    async def reject_pending(self) -> None:
        """Reject the requests still being decided (their cell is over) and wait for that."""
        for task in self._pending:
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    async def close(self) -> None:
        await self.reject_pending()
        await self._client.disconnect()
        await self._server.stop()

    async def _on_request(self, request: ApprovalRequest) -> None:
        # ApprovalClient awaits this before reading its next message, so decide in a task.
        if request.tool_name not in _SHELL_TOOLS:
            await request.reject()
            return
        task = asyncio.create_task(self._answer(request, str(request.tool_args.get("cmd", ""))))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _answer(self, request: ApprovalRequest, cmd: str) -> None:
        try:
            approved = await self._decide(cmd)
        except asyncio.CancelledError:
            await request.reject()
            raise
        except Exception:
            logger.exception("shell approval callback failed; rejecting %r", cmd)
            approved = False
        await (request.accept() if approved else request.reject())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((_HOST, 0))
        return sock.getsockname()[1]
