"""MCP tool calls of a turn, both ways: JSON tool calls the model makes (`<server>_<tool>`,
run concurrently by the execution step), and programmatic calls made from a cell through
the generated `mcptools` modules (over the kernel's stdin channel).

Every call is subject to the turn's policy as kind `tool` (rules `tool:<server>_<tool>`);
the servers are those the submission selected (`tools` option) from the node's config.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import ToolDefinition

from actfleet.broker.records import ApprovalRecord, TurnRecord
from actfleet.workers.approvals import ShellGate, refused_event
from actfleet.workers.context import NodeContext
from actfleet.workers.kernel import _preview
from actfleet.workers.mcp_codegen import import_hint, module_names, modules, write_modules
from actfleet.workers.mcp_servers import McpServerError, McpTool, RuntimeKey
from actfleet.workers.runtimes import Runtime

FAILED = "MCP tool call failed: "
INTERRUPTED = (
    "[actfleet] Interrupted: the node making this tool call died while it ran. It was not "
    "made again; it may or may not have had effects."
)


def selected_servers(turn: TurnRecord) -> list[str]:
    """The MCP servers the turn's submission selected."""
    tools = turn.options.get("tools") or []
    return [t for t in tools if isinstance(t, str)]


def runtime_key(runtime: Runtime) -> RuntimeKey:
    return runtime.session_id, runtime.agent_id


async def turn_tools(ctx: NodeContext, runtime: Runtime, turn: TurnRecord) -> list[McpTool]:
    """The tools of the turn's servers (each started on first use); McpServerError names
    a server that cannot start."""
    tools: list[McpTool] = []
    for server in selected_servers(turn):
        tools += await ctx.mcp.tools(server, runtime_key(runtime))
    return tools


async def tool_names(ctx: NodeContext, runtime: Runtime, turn: TurnRecord) -> list[str]:
    """The names of the turn's MCP tools that can be offered now (for an error message)."""
    try:
        return [tool.full_name for tool in await turn_tools(ctx, runtime, turn)]
    except McpServerError:
        return []


def definitions(tools: list[McpTool]) -> list[ToolDefinition]:
    """The JSON tools offered to the model, with how to call each from code."""
    names: dict[str, dict[str, str]] = {}
    for tool in tools:
        names.setdefault(tool.server, {})
    for server in names:
        names[server] = module_names(t for t in tools if t.server == server)
    return [
        ToolDefinition(
            name=tool.full_name,
            description=(
                f"{tool.description}\n\n{import_hint(tool, names[tool.server][tool.name])}"
            ).strip(),
            parameters_json_schema=tool.input_schema,
        )
        for tool in tools
    ]


async def write_tool_modules(ctx: NodeContext, runtime: Runtime, turn: TurnRecord) -> str:
    """Generate the turn's `mcptools` modules into the agent's working directory; the
    error of a server that cannot start ("" when all could)."""
    tools: list[McpTool] = []
    errors = []
    for server in selected_servers(turn):
        try:
            tools += await ctx.mcp.tools(server, runtime_key(runtime))
        except McpServerError as exc:
            errors.append(str(exc))
    await asyncio.to_thread(write_modules, runtime.workdir, modules(tools))
    return "; ".join(errors)


def _split(name: str, servers: list[str]) -> tuple[str, str] | None:
    """(server, tool) of a `<server>_<tool>` name, for a selected server."""
    for server in sorted(servers, key=len, reverse=True):
        if name.startswith(f"{server}_") and len(name) > len(server) + 1:
            return server, name[len(server) + 1 :]
    return None


def is_mcp_call(call: ToolCallPart, turn: TurnRecord) -> bool:
    """Whether the call is of a tool the model step offered from an MCP server."""
    verdict = turn.decisions.get(call.tool_call_id, {}).get("verdict")
    return verdict != "unknown" and _split(call.tool_name, selected_servers(turn)) is not None


async def run_json_calls(
    ctx: NodeContext,
    runtime: Runtime,
    turn: TurnRecord,
    calls: list[ToolCallPart],
    results: str,
    recorded: dict[str, str],
) -> dict[str, dict[str, Any]]:
    """Each MCP call's outcome, the calls made concurrently. A call is marked started in
    `results` before it is made and its outcome recorded after, so a call cut off by its
    node's death is reported as interrupted, never made twice."""

    async def one(call: ToolCallPart) -> dict[str, Any]:
        done = recorded.get(call.tool_call_id)
        if done is not None and done != "started":
            return json.loads(done)
        if done == "started":
            return {"status": "lost", "text": INTERRUPTED}
        await ctx.redis.hset(results, call.tool_call_id, "started")
        server, tool = _split(call.tool_name, selected_servers(turn)) or ("", "")
        outcome = await _call(ctx, runtime, turn, server, tool, call.args_as_dict())
        text = outcome.pop("full")
        preview, truncated = _preview(text, ctx.settings.output_cap)
        outcome.update(text=preview, truncated=truncated)
        if truncated:
            ref = f"{runtime.session_id}:{turn.turn_id}:{runtime.agent_id}:{call.tool_call_id}"
            await ctx.redis.set(ctx.keys.output(ref), text, ex=ctx.settings.output_ttl)
            outcome["output_ref"] = ref
        await ctx.redis.hset(results, call.tool_call_id, json.dumps(outcome))
        return outcome

    outcomes = await asyncio.gather(*(one(call) for call in calls))
    return {call.tool_call_id: o for call, o in zip(calls, outcomes, strict=True)}


async def _call(
    ctx: NodeContext,
    runtime: Runtime,
    turn: TurnRecord,
    server: str,
    tool: str,
    arguments: Any,
) -> dict[str, Any]:
    """One call of a configured server's tool: {"status", "full": text, "structured"}."""
    if not isinstance(arguments, dict):
        return {"status": "error", "full": f"{FAILED}the arguments must be a JSON object"}
    timeout = turn.options.get("execution_timeout", ctx.settings.execution_timeout)
    try:
        result = await ctx.mcp.call(server, tool, arguments, runtime_key(runtime), timeout)
    except McpServerError as exc:
        return {"status": "error", "full": f"{FAILED}{exc}"}
    except Exception as exc:
        return {"status": "error", "full": f"{FAILED}{type(exc).__name__}: {exc}"}
    if result.is_error:
        return {"status": "error", "full": f"{FAILED}{result.text}"}
    return {"status": "ok", "full": result.text, "structured": result.structured}


@dataclass
class CodeToolGate:
    """Serves the programmatic tool calls of one running cell: each is checked against the
    turn's servers and tools, decided under the policy as kind `tool` (a request with scope
    `cell`, made from code), and made by the node. Only the server's name, the tool's name
    and the arguments are taken from the kernel. A refusal is recorded in the shell gate's
    refusals: the cell raises and the turn ends."""

    ctx: NodeContext
    gate: ShellGate
    runtime: Runtime
    turn: TurnRecord

    async def __call__(self, request: dict[str, Any]) -> str:
        return json.dumps(await self._reply(request), default=str)

    async def _reply(self, request: dict[str, Any]) -> dict[str, Any]:
        server, tool, arguments = request["server"], request["tool"], request["arguments"]
        if not isinstance(server, str) or not isinstance(tool, str):
            return {"error": "a tool call needs a server name and a tool name"}
        if not isinstance(arguments, dict):
            return {"error": "a tool call's arguments must be a dict"}
        servers = selected_servers(self.turn)
        if server not in servers:
            return {"error": f"MCP server {server!r} is not one of this turn's: {servers}"}
        if self.gate.refusals:
            return {"rejected": "an earlier action of this cell was rejected; the turn ends"}
        try:
            offered = await self.ctx.mcp.tools(server, runtime_key(self.runtime))
        except McpServerError as exc:
            return {"error": f"{FAILED}{exc}"}
        if tool not in {t.name for t in offered}:
            names = ", ".join(t.name for t in offered)
            return {"error": f"MCP server {server!r} has no tool {tool!r}; it has: {names}"}
        full_name = f"{server}_{tool}"
        if refusal := await self._decide(full_name, arguments):
            self.gate.refusals.append(refusal)
            return {"rejected": refusal}
        outcome = await _call(self.ctx, self.runtime, self.turn, server, tool, arguments)
        if outcome["status"] != "ok":
            return {"error": outcome["full"]}
        return {"text": outcome["full"], "structured": outcome.get("structured")}

    async def _decide(self, full_name: str, arguments: dict[str, Any]) -> str:
        """Why the call is refused ("" when it may run)."""
        gate, env = self.gate, self.gate.envelope
        verdict, rule = gate.policy.decide("tool", full_name)
        if verdict == "deny":
            await self.ctx.emit([refused_event(env, full_name, rule)])
            return f"tool call {full_name} from code was denied by rule {rule}"
        if verdict == "allow":
            return ""
        record = ApprovalRecord.new(
            session_id=env["session_id"],
            agent_id=env["agent_id"],
            turn_id=env["turn_id"],
            kind="tool",
            tool_name=full_name,
            args=arguments,
            timeout=gate.timeout,
            scope="cell",
            corr_id=env["corr_id"],
        )
        await gate.approvals.open(record, env["parent_corr_id"])
        decided = await gate.approvals.wait(record.id)
        if decided.status == "approved":
            return ""
        why = f": {decided.reason}" if decided.reason else ""
        return f"tool call {full_name} from code was {decided.status} by {decided.approver}{why}"
