"""The turn's transitions, top to bottom, each one Lua script (`lua/<name>.lua`).

    submit ─> running ─ claim ─> step runs ─ commit: Advance ─> running (next step sent)
       │                                      │      Park ──> parked ─ decide / report ─> running
       └─> queued (behind the agent's turn)   │      End ───> finished | failed | cancelled
                                              │                └ next queued turn started
    spawn ─> waiting ─ pump (a slot) ─> running                └ a child reports to its parent
    cancel: parked and waiting turns woken to end cancelled; running steps told to stop

Every function returns a `Call`: run it with a sync client (`.run`) or an asyncio client
(`.arun`). Every step that becomes current is recorded in the dispatch set by the script
that makes it current and leaves it when its commit lands, so a send lost to a crash or a
Redis outage is sent again by a node's sweep.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import msgpack

from actfleet.broker.events import (
    ApprovalDecision,
    Cancelled,
    Event,
    SubagentFinished,
    TurnFailed,
    TurnFinished,
    encode,
)
from actfleet.broker.keys import Keys
from actfleet.broker.records import (
    ApprovalRecord,
    StepKind,
    StepRef,
    TurnRecord,
    hash_fields,
    usage_report,
)
from actfleet.broker.scripts import script
from actfleet.broker.settings import Settings
from actfleet.broker.stream import stamp

R = TypeVar("R")


def text(value: Any) -> str:
    """A Redis reply as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Call(Generic[R]):
    """One script call: its keys, its arguments, and how its reply is read."""

    name: str
    keys: Sequence[str]
    args: Sequence[Any]
    parse: Callable[[Any], R]

    def run(self, redis: Any) -> R:
        return self.parse(script(self.name).run(redis, self.keys, self.args))

    async def arun(self, redis: Any) -> R:
        return self.parse(await script(self.name).arun(redis, self.keys, self.args))


def _pack(payload: dict[str, Any]) -> bytes:
    return msgpack.packb(payload, use_bin_type=False)  # Redis' cmsgpack reads no bin type


def _now() -> str:
    return repr(time.time())


def _members(reply: Any) -> list[StepRef]:
    return [StepRef.decode(text(m)) for m in reply or [] if m]


def _step_ttl(settings: Settings) -> int:
    """How long a done step's record is kept: past any redelivery of its message."""
    if settings.retention <= 0:
        return 0
    return int(max(settings.retention, 2 * settings.visibility_timeout))


# ---- submit ---------------------------------------------------------------------------


def submit(
    keys: Keys, settings: Settings, turn: TurnRecord, started: Event, network: str = ""
) -> Call[str]:
    """Record a turn of a session's agent and start it when the agent is idle. The reply is
    "started" (its first step is to be sent), "queued", "exists" (already submitted) or
    "network" (refused: the session's kernel network was set otherwise by its first turn).
    `network` ("none" or "" for the nodes' own) is kept by a new session only."""
    s, a, t = turn.session_id, turn.agent_id, turn.turn_id
    payload = turn_payload(settings, turn, started, network)
    return Call(
        "submit",
        [
            keys.agent(s, a),
            keys.turn(t),
            keys.turn_queue(s, a),
            keys.seq(s),
            keys.stream(s),
            keys.sessions(),
            keys.session(s),
            keys.turn_started(t),
            keys.dispatch(),
            keys.session_agents(s),
            keys.history(s, a),
        ],
        [_pack(payload)],
        lambda reply: text(reply[0]),
    )


def turn_payload(
    settings: Settings, turn: TurnRecord, started: Event, network: str = ""
) -> dict[str, Any]:
    """What submitting a turn writes (lua/submit_turn.lib.lua's `p`)."""
    s, a, t = turn.session_id, turn.agent_id, turn.turn_id
    return {
        "turn_id": t,
        "agent_id": a,
        "session_id": s,
        "now": _now(),
        "maxlen": settings.stream_maxlen,
        "started": encode(stamp(started)),
        "first": StepRef.first(s, a, t).encode(),
        "fields": {k: str(v) for k, v in hash_fields(turn).items()},
        "network": network,
    }


# ---- claim ----------------------------------------------------------------------------

ClaimVerdict = Literal["ok", "cancel", "mine", "busy", "done", "refused"]


@dataclass(frozen=True)
class Claim:
    verdict: ClaimVerdict
    detail: str
    """ok/cancel: the dead node that had started the step, or ""; busy: its live owner;
    refused: why."""
    turn: TurnRecord | None
    """The turn record, read in the same script (ok and cancel)."""


def claim(keys: Keys, ref: StepRef, node: str, boot: str) -> Call[Claim]:
    """Take the turn's current step to run on this node (see lua/claim.lua)."""

    def parse(reply: Any) -> Claim:
        verdict, detail, flat = text(reply[0]), text(reply[1]), reply[2]
        turn = None
        if flat:
            raw = dict(zip(flat[::2], flat[1::2], strict=True))
            turn = TurnRecord.from_hash({**raw, b"turn_id": ref.turn_id}, ref.turn_id)
        return Claim(verdict, detail, turn)  # type: ignore[arg-type]

    return Call(
        "claim",
        [keys.step(ref.id), keys.turn(ref.turn_id), keys.cancel(ref.session_id), keys.dispatch()],
        [node, boot, ref.step_no, ref.kind, ref.encode(), _now(), keys.prefix],
        parse,
    )


# ---- commit ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """Turn fields a step may update besides its status and current step."""

    usage: dict[str, int | float] | None = None
    """The turn's usage so far (`TurnRecord.usage` fields)."""
    decisions: dict[str, Any] | None = None
    last_text: str | None = None
    rounds: int | None = None
    attempts: int | None = None

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.usage or {})
        if self.attempts is not None:
            out["attempts"] = self.attempts
        if self.decisions is not None:
            out["decisions"] = json.dumps(self.decisions, sort_keys=True)
        if self.last_text is not None:
            out["last_text"] = self.last_text
        if self.rounds is not None:
            out["rounds"] = self.rounds
        return out


@dataclass(frozen=True)
class Advance:
    """The turn goes on with its next step, sent at once."""

    next: StepKind
    history: list[bytes] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    progress: Progress = Progress()


@dataclass(frozen=True)
class Park:
    """The turn waits (holding no worker) for `waiting` decisions or subagent reports; the
    last of them sends its next step."""

    next: StepKind
    waiting: int
    history: list[bytes] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requests: list[ApprovalRecord] = field(default_factory=list)
    progress: Progress = Progress()


@dataclass(frozen=True)
class End:
    """The turn ends with one terminal event: finished (with a reason: completed,
    rejected, max_turns, budget), failed (with an error and its kind) or cancelled (with
    the phase it was in)."""

    status: Literal["finished", "failed", "cancelled"]
    reason: str = ""
    response: str = ""
    error: str = ""
    phase: str = ""
    history: list[bytes] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    usage: dict[str, int | float] | None = None
    """The turn's usage (`TurnRecord.usage` fields); None: as recorded."""
    error_kind: str = ""
    """failed: transient or permanent (see `TurnFailed`)."""
    attempts: int | None = None
    """None: as recorded."""


Outcome = Advance | Park | End


@dataclass(frozen=True)
class Committed:
    state: Literal["committed", "done", "stale"]
    """done: committed before (the sends are those of that commit); stale: the turn ended."""
    sends: list[StepRef]
    """The steps to send now."""


def commit(
    keys: Keys,
    settings: Settings,
    node: str,
    turn: TurnRecord,
    ref: StepRef,
    outcome: Outcome,
    *,
    drop_results: StepRef | None = None,
) -> Call[Committed]:
    """Record the step done with its outcome's effects (see lua/commit.lua). `drop_results`
    names the execution step whose per-call results this commit makes obsolete."""
    s, a, t = turn.session_id, turn.agent_id, turn.turn_id
    fields: dict[str, Any]
    report = None
    events = list(outcome.events)
    requests: list[ApprovalRecord] = []
    next_ref = ""
    if isinstance(outcome, End):
        usage = outcome.usage or turn.usage()
        attempts = outcome.attempts or turn.attempts
        env = turn.envelope(node, t)
        events.append(_terminal(outcome, env, usage, attempts))
        fields = {
            **usage,
            "status": outcome.status,
            "reason": outcome.reason or outcome.status,
            "response": outcome.response,
            "error": outcome.error,
            "error_kind": outcome.error_kind,
            "attempts": attempts,
            "finished_at": time.time(),
        }
        if turn.is_subagent:
            report = _report(turn, outcome, env)
    else:
        fields = {
            **outcome.progress.fields(),
            "step_no": ref.step_no + 1,
            "step_kind": outcome.next,
        }
        if isinstance(outcome, Park):
            fields |= {"status": "parked", "waiting": outcome.waiting, "rejected": 0}
            requests = outcome.requests
        else:
            next_ref = ref.next(outcome.next).encode()
    payload = {
        "session_id": s,
        "agent_id": a,
        "member": ref.encode(),
        "next": next_ref,
        "terminal": isinstance(outcome, End),
        "is_main": not turn.is_subagent,
        "now": _now(),
        "maxlen": settings.stream_maxlen,
        "step_ttl": _step_ttl(settings),
        "retention": int(settings.retention),
        "history": list(outcome.history),
        "events": [encode(stamp(e)) for e in events],
        "fields": {k: str(v) for k, v in fields.items()},
        "requests": [_open_fields(r) for r in requests],
        "report": report,
        "turn_prefix": keys.turn(""),
        "turnstart_prefix": keys.turn_started(""),
        "batch": keys.batch(turn.batch) if turn.batch else "",
    }
    parent = _parent_keys(keys, turn)
    results = keys.step_results(drop_results.id) if drop_results else ""

    def parse(reply: Any) -> Committed:
        state = {1: "committed", 0: "done", -1: "stale"}[int(reply[0])]
        return Committed(state, [StepRef.decode(m) for m in text(reply[1]).split()])  # type: ignore[arg-type]

    return Call(
        "commit",
        [
            keys.step(ref.id),
            keys.turn(t),
            keys.history(s, a),
            keys.seq(s),
            keys.stream(s),
            keys.agent(s, a),
            keys.turn_queue(s, a),
            keys.dispatch(),
            keys.sessions(),
            keys.session(s),
            keys.session_agents(s),
            results,
            *parent,
            keys.approvals(),
            keys.approvals_expiry(),
            keys.approvals(s),
            *(keys.approval(r.id) for r in requests),
        ],
        [_pack(payload)],
        parse,
    )


_DECISION_FIELDS = ("status", "approver", "reason", "decided_at")


def _terminal(
    outcome: End, env: dict[str, Any], usage: dict[str, int | float], attempts: int
) -> Event:
    report = usage_report(usage)
    if outcome.status == "finished":
        return TurnFinished(
            **env,
            reason=outcome.reason,
            response=outcome.response,
            usage=report,
            attempts=attempts,
        )
    if outcome.status == "failed":
        return TurnFailed(
            **env,
            error=outcome.error,
            usage=report,
            attempts=attempts,
            error_kind=outcome.error_kind,
        )
    return Cancelled(**env, phase=outcome.phase)


def _report(turn: TurnRecord, outcome: End, env: dict[str, Any]) -> dict[str, Any]:
    """What a subagent's end reports to its parent's call: its outcome (as an execution
    outcome: status and text) and its SubagentFinished event."""
    status = outcome.reason or outcome.status
    if outcome.status == "finished" and outcome.reason == "completed":
        said = outcome.response
    else:
        said = outcome.error or (
            f"The subagent's turn ended: {status}"
            + (f" ({outcome.phase})" if outcome.phase else "")
            + (f". Its last answer: {outcome.response}" if outcome.response else "")
        )
    finished = SubagentFinished(**env, subagent_id=turn.agent_id, status=status, response=said)
    resume = StepRef(
        turn.session_id, turn.parent_agent, turn.parent_turn, turn.parent_step + 1, "collect"
    )
    return {
        "call_id": turn.parent_call,
        "outcome": json.dumps({"status": status, "text": said}),
        "finished": encode(stamp(finished)),
        "child": turn.agent_id,
        "resume": resume.encode(),
    }


def _parent_keys(keys: Keys, turn: TurnRecord) -> list[str]:
    """Parent turn, parent's results, parent's slots, fleet slots ("" when no parent)."""
    if not turn.is_subagent:
        return ["", "", "", ""]
    s = turn.session_id
    spawner = StepRef(s, turn.parent_agent, turn.parent_turn, turn.parent_step, "execution")
    return [
        keys.turn(turn.parent_turn),
        keys.step_results(spawner.id),
        keys.slots(s, turn.parent_agent),
        keys.fleet_slots(),
    ]


# ---- approvals: open (from a running cell) and decide ---------------------------------


def open_request(
    keys: Keys, settings: Settings, record: ApprovalRecord, event: Event
) -> Call[None]:
    """Open a request a running cell waits on, and announce it (see lua/open_request.lua)."""
    payload = {
        "record": _open_fields(record),
        "event": encode(stamp(event)),
        "maxlen": settings.stream_maxlen,
    }
    return Call(
        "open_request",
        _request_keys(keys, record),
        [_pack(payload)],
        lambda reply: None,
    )


DecisionStatus = Literal["approved", "rejected", "expired", "withdrawn"]


@dataclass(frozen=True)
class Decision:
    status: str
    """As recorded (an approval of an overdue request is recorded as expired)."""
    verdict: Literal["", "resume", "unknown", "hash", "decided"]
    detail: str
    resume: StepRef | None = None


def decide(
    keys: Keys,
    settings: Settings,
    record: ApprovalRecord,
    *,
    status: DecisionStatus,
    args_sha: str,
    approver: str,
    reason: str,
    decision_id: str,
    node: str = "",
) -> Call[Decision]:
    """Decide a request (see lua/decide.lua)."""
    if status == "expired":
        reason = reason or expired_reason(record)
    env = {
        "session_id": record.session_id,
        "agent_id": record.agent_id,
        "turn_id": record.turn_id,
        "corr_id": record.corr_id,
        "node": node,
    }
    decided = ApprovalDecision(
        **env,
        request_id=record.id,
        approved=status == "approved",
        approver=approver,
        reason=reason,
    )
    expired = ApprovalDecision(
        **env,
        request_id=record.id,
        approved=False,
        approver="actfleet",
        reason=expired_reason(record),
    )
    payload = {
        "request_id": record.id,
        "status": status,
        "args_sha256": args_sha,
        "approver": approver,
        "reason": reason,
        "now": _now(),
        "decision_id": decision_id,
        "decided": encode(stamp(decided)),
        "expired": encode(stamp(expired)),
        "maxlen": settings.stream_maxlen,
        "retention": int(settings.retention),
        "channel": keys.decided(),
    }

    def parse(reply: Any) -> Decision:
        status_, verdict, detail = (text(x) for x in reply)
        resume = StepRef.decode(detail) if verdict == "resume" else None
        return Decision(status_, verdict, detail, resume)  # type: ignore[arg-type]

    return Call(
        "decide",
        [*_request_keys(keys, record), keys.turn(record.turn_id), keys.dispatch()],
        [_pack(payload)],
        parse,
    )


def _request_keys(keys: Keys, record: ApprovalRecord) -> list[str]:
    """A request's record, the pending indexes, and its session's stream (seq, stream)."""
    s = record.session_id
    return [
        keys.approval(record.id),
        keys.approvals(),
        keys.approvals(s),
        keys.approvals_expiry(),
        keys.seq(s),
        keys.stream(s),
    ]


def _open_fields(record: ApprovalRecord) -> dict[str, str]:
    """A request's fields as it is opened (no decision yet)."""
    return {k: str(v) for k, v in hash_fields(record).items() if k not in _DECISION_FIELDS}


def expired_reason(record: ApprovalRecord) -> str:
    timeout = record.expires_at - record.created_at
    return f"expired: no decision within {timeout:g} s counts as rejected"


# ---- subagents: spawn and pump --------------------------------------------------------


def pump_member(session_id: str, parent_agent: str, cap: int) -> str:
    """How a parent with waiting children is named in the set the nodes sweep."""
    return f"{session_id}|{parent_agent}|{cap}"


def spawn(keys: Keys, child: TurnRecord, started: Event, *, cap: int) -> Call[bool]:
    """Record a child agent and its turn, waiting for a slot (see lua/spawn.lua)."""
    s = child.session_id
    payload = {
        "fields": {k: str(v) for k, v in hash_fields(child).items()},
        "started": encode(stamp(started)),
        "child": child.agent_id,
        "child_turn": child.turn_id,
        "parent_agent": child.parent_agent,
        "pump": pump_member(s, child.parent_agent, cap),
    }
    return Call(
        "spawn",
        [
            keys.turn(child.turn_id),
            keys.turn_started(child.turn_id),
            keys.agent(s, child.agent_id),
            keys.session_agents(s),
            keys.child_queue(s, child.parent_agent),
            keys.pumps(),
        ],
        [_pack(payload)],
        lambda reply: bool(reply),
    )


def pump(
    keys: Keys, settings: Settings, session_id: str, parent_agent: str, cap: int
) -> Call[list[StepRef]]:
    """Start the parent's waiting children that the caps allow (see lua/pump.lua); the reply
    is their first steps, to send."""
    payload = {
        "now": _now(),
        "maxlen": settings.stream_maxlen,
        "cap": cap,
        "fleet_cap": settings.max_agents,
        "ttl": settings.lease_ttl,
        "pump": pump_member(session_id, parent_agent, cap),
        "turn_prefix": keys.turn(""),
        "turnstart_prefix": keys.turn_started(""),
        "agent_prefix": keys.agent("", "").removesuffix(":"),
    }
    return Call(
        "pump",
        [
            keys.child_queue(session_id, parent_agent),
            keys.slots(session_id, parent_agent),
            keys.fleet_slots(),
            keys.pumps(),
            keys.dispatch(),
            keys.seq(session_id),
            keys.stream(session_id),
        ],
        [_pack(payload)],
        _members,
    )


# ---- cancel ---------------------------------------------------------------------------


def cancel(keys: Keys, settings: Settings, session_id: str) -> Call[list[StepRef]]:
    """Cancel everything the session runs (see lua/cancel.lua); the reply is the steps to
    send so that idle turns end too."""
    keep = int(max(settings.retention, 86400)) if settings.retention > 0 else 86400 * 365
    return Call(
        "cancel",
        [keys.cancel(session_id), keys.session_agents(session_id), keys.dispatch()],
        [
            _now(),
            session_id,
            keys.cancels(),
            keep,
            keys.agent("", "").removesuffix(":"),
            keys.turn(""),
            keys.child_queue("", "").removesuffix(":"),
        ],
        _members,
    )


# ---- leases ---------------------------------------------------------------------------


def take_lease(
    keys: Keys, session_id: str, agent_id: str, *, node: str, boot: str, ttl: float
) -> Call[tuple[str, str]]:
    """Hold the agent's runtime lease: ("held" | "acquired", previous holder) or
    ("other", the live holder's node name)."""
    return Call(
        "lease",
        [keys.lease(session_id, agent_id), keys.node_agents(node)],
        [f"{node}|{boot}", int(ttl * 1000), f"{session_id}/{agent_id}", keys.prefix],
        lambda reply: (text(reply[0]), text(reply[1])),
    )


def lease_holder(value: Any) -> str:
    """The node name in a lease value (`name|boot`), or "" for none."""
    return text(value).split("|", 1)[0] if value else ""


def route(keys: Keys, lease_value: Any) -> str:
    """The queue for an agent's next step: its runtime's node, or the shared queue."""
    holder = lease_holder(lease_value)
    return keys.node_queue(holder) if holder else keys.shared_queue()
