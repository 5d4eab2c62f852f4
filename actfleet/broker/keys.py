"""Every Redis key actfleet uses, named in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix (`ACTFLEET_KEY_PREFIX`)."""

    prefix: str = "actfleet"

    def stream(self, session_id: str) -> str:
        """The session's event stream (trimmed)."""
        return f"{self.prefix}:stream:{session_id}"

    def seq(self, session_id: str) -> str:
        return f"{self.prefix}:seq:{session_id}"

    def session(self, session_id: str) -> str:
        """Hash: network, created_at, and the usage totals of the main agent's ended turns
        (input_tokens, output_tokens, requests, cost, unpriced; subagents included)."""
        return f"{self.prefix}:session:{session_id}"

    def sessions(self) -> str:
        """Sorted set of session ids by last activity."""
        return f"{self.prefix}:sessions"

    def agent(self, session_id: str, agent_id: str) -> str:
        """Hash: model, replay script, options, active turn, runtime epoch."""
        return f"{self.prefix}:agent:{session_id}:{agent_id}"

    def turn_queue(self, session_id: str, agent_id: str) -> str:
        """Turns submitted while another turn of the agent runs, oldest first."""
        return f"{self.prefix}:turnq:{session_id}:{agent_id}"

    def history(self, session_id: str, agent_id: str) -> str:
        """List of the agent's model messages, one JSON document each."""
        return f"{self.prefix}:history:{session_id}:{agent_id}"

    def turn(self, turn_id: str) -> str:
        """Hash: status, current step, usage, response or error."""
        return f"{self.prefix}:turn:{turn_id}"

    def turn_started(self, turn_id: str) -> str:
        """The TurnStarted event of a queued turn, written to the stream when it starts."""
        return f"{self.prefix}:turnstart:{turn_id}"

    def step(self, step_id: str) -> str:
        """Hash: owner node, state (running or done)."""
        return f"{self.prefix}:step:{step_id}"

    def step_results(self, step_id: str) -> str:
        """Hash: per tool call of an execution step, its result once it ran."""
        return f"{self.prefix}:stepres:{step_id}"

    def lease(self, session_id: str, agent_id: str) -> str:
        """The node holding the agent's runtime (expires unless renewed)."""
        return f"{self.prefix}:lease:{session_id}:{agent_id}"

    def node(self, name: str) -> str:
        """A node's heartbeat (expires unless renewed)."""
        return f"{self.prefix}:node:{name}"

    def node_info(self, name: str) -> str:
        """Hash: what a node reports on each beat (capacity, runtimes, kernels, running
        steps), for monitors; expires with its heartbeat."""
        return f"{self.prefix}:nodeinfo:{name}"

    def nodes(self) -> str:
        """Set of node names that registered and have not been taken over."""
        return f"{self.prefix}:nodes"

    def node_agents(self, name: str) -> str:
        """Set of `session_id/agent_id` whose runtime the node holds."""
        return f"{self.prefix}:nodeagents:{name}"

    def takeover(self, name: str) -> str:
        """Claimed by the one node that recovers a dead node's work."""
        return f"{self.prefix}:takeover:{name}"

    def approval(self, request_id: str) -> str:
        """Hash: an approval request and, once decided, its decision."""
        return f"{self.prefix}:approval:{request_id}"

    def approvals(self, session_id: str = "") -> str:
        """Sorted set (by creation time) of pending requests: all, or one session's."""
        return f"{self.prefix}:approvals:{session_id}" if session_id else f"{self.prefix}:approvals"

    def approvals_expiry(self) -> str:
        """Sorted set of pending requests by expiry time."""
        return f"{self.prefix}:approvals:expiry"

    def decided(self) -> str:
        """Pub/sub channel: the id of each request as it is decided."""
        return f"{self.prefix}:decided"

    def dispatch(self) -> str:
        """Sorted set of steps sent but not yet claimed, by when they were (re)sent; nodes
        send again the ones left too long, so no submission or decision is lost."""
        return f"{self.prefix}:dispatch"

    def output(self, ref: str) -> str:
        """A cell's full output, kept when the preview was truncated."""
        return f"{self.prefix}:output:{ref}"

    def session_agents(self, session_id: str) -> str:
        """Set of the session's agent ids (main and subagents)."""
        return f"{self.prefix}:agents:{session_id}"

    def child_queue(self, session_id: str, parent_agent: str) -> str:
        """Turn ids of a parent's children waiting for a slot, oldest first."""
        return f"{self.prefix}:childq:{session_id}:{parent_agent}"

    def slots(self, session_id: str, parent_agent: str) -> str:
        """Sorted set: a parent's running children, scored by their slot lease's expiry."""
        return f"{self.prefix}:slots:{session_id}:{parent_agent}"

    def fleet_slots(self) -> str:
        """Sorted set: every running subagent (`session/agent`), scored like `slots`."""
        return f"{self.prefix}:slots"

    def pumps(self) -> str:
        """Set of parents with children waiting for a slot (`session|agent|cap`)."""
        return f"{self.prefix}:pumps"

    def cancel(self, session_id: str) -> str:
        """When the session was last cancelled: turns created before then are cancelled."""
        return f"{self.prefix}:cancel:{session_id}"

    def cancels(self) -> str:
        """Pub/sub channel: the id of each session as it is cancelled."""
        return f"{self.prefix}:cancels"

    def admission(self) -> str:
        """Sorted set: first steps of agents waiting for a node with room, scored by
        priority, then arrival (lowest first)."""
        return f"{self.prefix}:admission"

    def admit(self) -> str:
        """Pub/sub channel: an agent waits for room (nodes with room then admit it)."""
        return f"{self.prefix}:admit"

    def batches(self) -> str:
        """Sorted set of batch ids by creation time."""
        return f"{self.prefix}:batches"

    def batches_active(self) -> str:
        """Set of batches with items queued or active (the nodes' sweep pumps them)."""
        return f"{self.prefix}:batches:active"

    def batch(self, batch: str) -> str:
        """Hash: a batch's options, status, counts per result status and usage."""
        return f"{self.prefix}:batch:{batch}"

    def batch_items(self, batch: str) -> str:
        """Hash: custom_id -> the item (the turn payload its start submits)."""
        return f"{self.prefix}:batchitems:{batch}"

    def batch_queue(self, batch: str) -> str:
        """List of custom_ids not started yet, first to start first."""
        return f"{self.prefix}:batchq:{batch}"

    def batch_active(self, batch: str) -> str:
        """Hash: turn id -> custom_id of the items started and not yet reported."""
        return f"{self.prefix}:batchactive:{batch}"

    def batch_results(self, batch: str) -> str:
        """Stream: one entry per ended item, in completion order."""
        return f"{self.prefix}:batchresults:{batch}"

    def batch_done(self, batch: str) -> str:
        """Hash: custom_id -> result status of the items reported (each reported once)."""
        return f"{self.prefix}:batchdone:{batch}"

    def shared_queue(self) -> str:
        """The Celery queue every node consumes: new agents, orphaned work."""
        return f"{self.prefix}.shared"

    def node_queue(self, name: str) -> str:
        """The Celery queue only the named node consumes (its agents' steps)."""
        return f"{self.prefix}.node.{name}"

    def image(self, name: str) -> str:
        """An image a cell displayed, by its file name (`<sha256>.<ext>`)."""
        return f"{self.prefix}:image:{name}"

    def dead_letters(self) -> str:
        """List of messages that could not be read (newest first, trimmed), with the reason."""
        return f"{self.prefix}:deadletters"

    def mcp_servers(self) -> str:
        """Hash: node name -> JSON list of the MCP server names it has configured (written
        at node start, so a client can refuse a submission naming an unknown server)."""
        return f"{self.prefix}:mcp_servers"
