"""The MCP servers a node offers, read from the `mcpServers` JSON file that
`ACTFLEET_MCP_CONFIG` names (the format Claude Desktop and freeact use).

Only the node's operator configures servers: a submission names servers, never a command,
URL or environment. `${VAR}` in a server's strings is expanded from the node's environment
when the file is read, so secrets stay in that environment. A bad file stops the node at
start with an error naming the server and the field at fault.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Scope = Literal["node", "runtime"]
SERVER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
"""A server name: a Python identifier (its tools are imported as `mcptools.<server>`)."""
DEFAULT_INIT_TIMEOUT = 30.0
"""Seconds a server has to start and answer `initialize` (servers started beside kernels
have needed 20 s and more)."""

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_STDIO_KEYS = {"command", "args", "env", "cwd"}
_HTTP_KEYS = {"url", "headers"}
_COMMON_KEYS = {"type", "init_timeout", "exclude_tools", "scope"}
_HTTP_TYPES = ("http", "streamable-http", "streamableHttp")


class McpConfigError(ValueError):
    """The MCP config cannot be used; the message names the file, server and field."""


@dataclass(frozen=True)
class McpServerConfig:
    """One configured server: stdio (`command`) or streamable HTTP (`url`)."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    init_timeout: float = DEFAULT_INIT_TIMEOUT
    exclude_tools: frozenset[str] = frozenset()
    scope: Scope = "node"
    """node: one process shared by the node's runtimes; runtime: one per agent runtime."""

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "http" if self.url else "stdio"


def load_mcp_config(
    path: str, environ: Mapping[str, str] | None = None
) -> dict[str, McpServerConfig]:
    """The servers of the file at `path` ({} for an empty path); McpConfigError if the
    file is missing, not JSON, or a server is not usable as written."""
    if not path:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise McpConfigError(
            f"ACTFLEET_MCP_CONFIG={path}: cannot read it ({exc}); give a UTF-8 JSON file "
            '{"mcpServers": {NAME: {"command": ...} or {"url": ...}}}'
        ) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise McpConfigError(f"{path}: not JSON ({exc}); fix the syntax") from None
    return parse_mcp_config(data, os.environ if environ is None else environ, path)


def parse_mcp_config(
    data: object, environ: Mapping[str, str], source: str = "MCP config"
) -> dict[str, McpServerConfig]:
    """The servers of a parsed `{"mcpServers": {...}}` document."""
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise McpConfigError(f'{source}: needs an object "mcpServers": {{NAME: {{...}}}}')
    return {
        name: _server(name, entry, environ, f"{source}: mcpServers.{name}")
        for name, entry in servers.items()
    }


def _server(name: str, entry: object, environ: Mapping[str, str], where: str) -> McpServerConfig:
    if not SERVER_NAME.fullmatch(name):
        raise McpConfigError(
            f"{where}: a server name must be a letter then up to 31 letters, digits or _ "
            "(it becomes a Python package name and the prefix of its tools' names)"
        )
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where}: must be an object with a command or a url")
    unknown = set(entry) - _STDIO_KEYS - _HTTP_KEYS - _COMMON_KEYS
    if unknown:
        known = ", ".join(sorted(_STDIO_KEYS | _HTTP_KEYS | _COMMON_KEYS))
        raise McpConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; the keys are {known}")
    kind = entry.get("type", "http" if "url" in entry else "stdio")
    if kind == "sse":
        raise McpConfigError(f"{where}: SSE servers are not supported; use streamable HTTP")
    if kind not in ("stdio", *_HTTP_TYPES):
        raise McpConfigError(f"{where}: type {kind!r} is not stdio or http")
    is_http = kind in _HTTP_TYPES
    needed, other = ("url", _STDIO_KEYS) if is_http else ("command", _HTTP_KEYS)
    if not isinstance(entry.get(needed), str) or not entry[needed]:
        raise McpConfigError(f"{where}: a {'http' if is_http else 'stdio'} server needs {needed}")
    if misplaced := set(entry) & other:
        raise McpConfigError(
            f"{where}: {sorted(misplaced)[0]!r} does not apply to a {kind} server; give either "
            "command/args/env/cwd (stdio) or url/headers (http)"
        )

    def expand(value: object, key: str) -> str:
        if not isinstance(value, str):
            raise McpConfigError(f"{where}.{key}: must be a string, got {value!r}")

        def variable(match: re.Match[str]) -> str:
            if match[1] not in environ:
                raise McpConfigError(
                    f"{where}.{key}: ${{{match[1]}}} is not set in the node's environment; "
                    "set it before starting the node"
                )
            return environ[match[1]]

        return _VAR.sub(variable, value)

    def strings(key: str) -> dict[str, str]:
        value = entry.get(key, {})
        if not isinstance(value, dict):
            raise McpConfigError(f"{where}.{key}: must be an object of strings")
        return {k: expand(v, f"{key}.{k}") for k, v in value.items()}

    args = entry.get("args", [])
    if not isinstance(args, list):
        raise McpConfigError(f"{where}.args: must be a list of strings")
    timeout = entry.get("init_timeout", DEFAULT_INIT_TIMEOUT)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise McpConfigError(f"{where}.init_timeout: must be a positive number of seconds")
    excluded = entry.get("exclude_tools", [])
    if not isinstance(excluded, list) or not all(isinstance(t, str) for t in excluded):
        raise McpConfigError(f"{where}.exclude_tools: must be a list of tool names")
    scope = entry.get("scope", "node")
    if scope not in ("node", "runtime"):
        raise McpConfigError(
            f"{where}.scope: {scope!r} is not node (one process shared by the node's "
            "runtimes, the default) or runtime (one per agent runtime)"
        )
    return McpServerConfig(
        name=name,
        command=expand(entry.get("command", ""), "command"),
        args=tuple(expand(a, f"args[{i}]") for i, a in enumerate(args)),
        env=strings("env"),
        cwd=expand(entry.get("cwd", ""), "cwd"),
        url=expand(entry.get("url", ""), "url"),
        headers=strings("headers"),
        init_timeout=float(timeout),
        exclude_tools=frozenset(excluded),
        scope=scope,
    )
