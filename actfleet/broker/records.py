"""The typed records actfleet keeps in Redis hashes, and the one address of a step.

Every field is named and typed here; nothing outside the broker spells a field name. A
record that cannot be read (a missing or mistyped field) raises `BadRecord`, so one broken
hash is skipped with a reason instead of stopping whoever reads it.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from actfleet.broker.ids import BadId, check_id

StepKind = Literal["model", "execution", "collect"]
STEP_KINDS: tuple[StepKind, ...] = get_args(StepKind)
TurnStatus = Literal["queued", "waiting", "running", "parked", "finished", "failed", "cancelled"]
"""queued: behind another turn of its agent; waiting: a subagent waiting for a slot;
running: its current step is sent or runs; parked: waiting for decisions or subagents."""
ENDED: tuple[TurnStatus, ...] = ("finished", "failed", "cancelled")


class BadRecord(ValueError):
    """A record or a message that cannot be read; the message says what is wrong."""


@dataclass(frozen=True)
class StepRef:
    """One step of one turn: the address used for Celery task arguments, dispatch members,
    and (through `Keys`) the step's records. Encoded as `session|agent|turn|step_no|kind`;
    ids cannot contain `|`."""

    session_id: str
    agent_id: str
    turn_id: str
    step_no: int
    kind: StepKind

    def encode(self) -> str:
        return f"{self.session_id}|{self.agent_id}|{self.turn_id}|{self.step_no}|{self.kind}"

    @property
    def id(self) -> str:
        """The step's id (`turn:step_no:kind`), unique across the fleet."""
        return f"{self.turn_id}:{self.step_no}:{self.kind}"

    def next(self, kind: StepKind) -> StepRef:
        return dataclasses.replace(self, step_no=self.step_no + 1, kind=kind)

    @classmethod
    def first(cls, session_id: str, agent_id: str, turn_id: str) -> StepRef:
        return cls(session_id, agent_id, turn_id, 1, "model")

    @classmethod
    def decode(cls, value: object) -> StepRef:
        """The step a message or a dispatch member names; BadRecord when it names none."""
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        if not isinstance(value, str):
            raise BadRecord(f"a step reference must be a string, got {type(value).__name__}")
        parts = value.split("|")
        if len(parts) != 5:
            raise BadRecord(f"step reference {value[:80]!r} does not have 5 parts")
        session_id, agent_id, turn_id, step_no, kind = parts
        try:
            for name, part in (("session", session_id), ("agent", agent_id), ("turn", turn_id)):
                check_id(part, f"{name} id")
        except BadId as exc:
            raise BadRecord(f"step reference {value[:80]!r}: {exc}") from None
        if not (step_no.isascii() and step_no.isdigit()) or not 0 < int(step_no) < 1_000_000:
            raise BadRecord(f"step reference {value[:80]!r}: bad step number {step_no[:20]!r}")
        if kind not in STEP_KINDS:
            raise BadRecord(f"step reference {value[:80]!r}: unknown step kind {kind[:20]!r}")
        return cls(session_id, agent_id, turn_id, int(step_no), kind)  # type: ignore[arg-type]


def _text(value: Any, errors: str = "strict") -> str:
    return value.decode(errors=errors) if isinstance(value, bytes) else str(value)


def _int(value: str) -> int:
    """An int field: its digits, or a number written as a float (`3.0`)."""
    try:
        return int(value)
    except ValueError:
        return int(float(value))


def read_hash(cls: type[Any], raw: dict[Any, Any], what: str) -> Any:
    """A record dataclass from a Redis hash: fields converted to their declared types
    (str, int, float, dict from JSON); unknown fields ignored; BadRecord on anything else,
    such as text that is not UTF-8 or a number out of range."""
    data = {_text(k, "replace"): v for k, v in raw.items()}
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise BadRecord(f"{what} has no field {f.name!r}")
            continue
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        try:
            value = _text(data[f.name])
            if kind == "int":
                values[f.name] = _int(value or "0")
            elif kind == "float":
                values[f.name] = float(value or 0)
            elif kind.startswith("dict"):
                values[f.name] = json.loads(value) if value else {}
                if not isinstance(values[f.name], dict):
                    raise ValueError("not a JSON object")
            else:
                values[f.name] = value
        except (ValueError, OverflowError, RecursionError) as exc:
            shown = _text(data[f.name], "replace")[:40]
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:80]
            raise BadRecord(f"{what}: field {f.name!r} = {shown!r} ({reason})") from None
    return cls(**values)


def hash_fields(record: Any, *names: str) -> dict[str, str | int | float]:
    """Fields of a record as a Redis hash mapping (dicts as JSON); all fields, or `names`."""
    out: dict[str, str | int | float] = {}
    for f in dataclasses.fields(record):
        if names and f.name not in names:
            continue
        value = getattr(record, f.name)
        out[f.name] = json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
    return out


@dataclass(frozen=True)
class TurnRecord:
    """One turn of one agent (`Keys.turn`)."""

    session_id: str
    agent_id: str
    turn_id: str
    prompt: str
    model: str
    created_at: float
    status: str = "queued"
    """A `TurnStatus`."""
    replay: str = ""
    """The replay script's text, for `replay:` models."""
    options: dict[str, Any] = field(default_factory=dict)
    """The submission's agent options and approval policy."""
    step_no: int = 0
    step_kind: str = "model"
    """The `StepKind` of the current step."""
    started_at: float = 0.0
    finished_at: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    cost: float = 0.0
    """USD of the model steps with a known price (subagents included)."""
    unpriced: int = 0
    """Model steps whose price is unknown (subagents included)."""
    attempts: int = 1
    """1 + the model requests retried in this turn."""
    error_kind: str = ""
    """For a failed turn: transient or permanent (see `TurnFailed`)."""
    rounds: int = 0
    """Tool-execution rounds so far (bounded by `max_turns`)."""
    decisions: dict[str, Any] = field(default_factory=dict)
    """Per tool call of the last response: its policy verdict, rule and request id."""
    waiting: int = 0
    """Pending approval requests, or subagents not yet reported, while parked."""
    rejected: int = 0
    """1 once a request of the current response was rejected or expired."""
    last_text: str = ""
    reason: str = ""
    response: str = ""
    error: str = ""
    cancel_phase: str = ""
    parent_turn: str = ""
    """For a subagent's turn: its parent's turn, agent, call and the step that spawned it."""
    parent_agent: str = ""
    parent_call: str = ""
    parent_step: int = 0
    max_subagents: int = 5
    priority: int = 0
    """Higher is admitted first when agents wait for room (admission.py)."""
    batch: str = ""
    """The batch this turn is an item of ("" none)."""

    @property
    def is_subagent(self) -> bool:
        return bool(self.parent_turn)

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    @property
    def current(self) -> StepRef:
        return StepRef(self.session_id, self.agent_id, self.turn_id, self.step_no, self.step_kind)  # type: ignore[arg-type]

    def envelope(self, node: str, corr_id: str = "") -> dict[str, Any]:
        """The envelope of an event about this turn."""
        return {
            "session_id": self.session_id,
            "agent_id": self.agent_id,
            "turn_id": self.turn_id,
            "corr_id": corr_id,
            "parent_corr_id": self.parent_call,
            "node": node,
        }

    def usage(self) -> dict[str, int | float]:
        """The usage fields as kept in the hash (a known cost of 0 and an unknown one alike
        are 0.0 in `cost`; `usage_report` tells them apart)."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "requests": self.requests,
            "cost": self.cost,
            "unpriced": self.unpriced,
        }

    @classmethod
    def from_hash(cls, raw: dict[Any, Any], turn_id: str = "") -> TurnRecord:
        if not raw:
            raise BadRecord(f"turn {turn_id or '?'} has no record")
        return read_hash(cls, raw, f"turn {turn_id or '?'}")


def usage_report(usage: dict[str, int | float]) -> dict[str, int | float | None]:
    """Usage as events and results report it (`TurnFinished.usage`): `cost` None when no model
    step had a known price, never 0 for unknown."""
    requests, unpriced = int(usage.get("requests", 0)), int(usage.get("unpriced", 0))
    unknown = requests > 0 and unpriced >= requests
    return {**usage, "cost": None if unknown else float(usage.get("cost", 0.0))}


CURRENT_STEP = ("status", "step_no", "step_kind")
"""The turn fields that name its current step (read with HMGET, see `running_step`)."""


def running_step(session_id: str, agent_id: str, turn_id: str, values: list[Any]) -> StepRef | None:
    """The current step of a running turn from its `CURRENT_STEP` fields, else None."""
    status, step_no, kind = (_text(v, "replace") if v is not None else "" for v in values)
    if status != "running":
        return None
    try:
        return StepRef.decode(f"{session_id}|{agent_id}|{turn_id}|{step_no}|{kind}")
    except BadRecord:
        return None


@dataclass(frozen=True)
class AgentRecord:
    """One agent of a session (`Keys.agent`)."""

    active_turn: str = ""
    epoch: int = 0
    """How many runtimes the agent has had: above 1, its kernel was restarted."""
    released: str = ""
    """Why its last runtime was released (told to the model with the restart notice)."""
    kept: int = 0
    """1 when its last runtime was released losing nothing (its kernel never ran a cell):
    the next runtime tells the model nothing."""
    parent_agent: str = ""

    ACTIVE_TURN: ClassVar[str] = "active_turn"
    EPOCH: ClassVar[str] = "epoch"
    RELEASED: ClassVar[str] = "released"
    KEPT: ClassVar[str] = "kept"

    @classmethod
    def from_hash(cls, raw: dict[Any, Any]) -> AgentRecord:
        return read_hash(cls, raw, "agent")


ApprovalKind = Literal["code", "shell", "tool", "subagent"]
APPROVAL_KINDS: tuple[ApprovalKind, ...] = get_args(ApprovalKind)


@dataclass(frozen=True)
class ApprovalRecord:
    """A request for a human decision (`Keys.approval`)."""

    id: str
    session_id: str
    agent_id: str
    turn_id: str
    kind: str
    """An `ApprovalKind`."""
    tool_name: str
    args: dict[str, Any]
    args_sha256: str
    created_at: float
    expires_at: float = 0.0
    """0: never."""
    scope: str = "step"
    """step: decides a parked turn's call; cell: a shell command a running cell waits on."""
    corr_id: str = ""
    dispatch: str = ""
    """The step (an encoded `StepRef`) that resumes the turn (scope step)."""
    status: str = "pending"
    """pending, approved, rejected, expired or withdrawn."""
    approver: str = ""
    reason: str = ""
    decided_at: float = 0.0

    @classmethod
    def new(
        cls,
        *,
        session_id: str,
        agent_id: str,
        turn_id: str,
        kind: str,
        tool_name: str,
        args: dict[str, Any],
        timeout: float | None,
        **extra: Any,
    ) -> ApprovalRecord:
        from actfleet.broker.approvals import args_sha256

        now = time.time()
        return cls(
            id=f"a-{uuid.uuid4().hex[:10]}",
            session_id=session_id,
            agent_id=agent_id,
            turn_id=turn_id,
            kind=kind,
            tool_name=tool_name,
            args=args,
            args_sha256=args_sha256(tool_name, args),
            created_at=now,
            expires_at=now + timeout if timeout else 0.0,
            **extra,
        )

    @classmethod
    def from_hash(cls, raw: dict[Any, Any], request_id: str = "") -> ApprovalRecord:
        if not raw:
            raise BadRecord(f"approval request {request_id or '?'} has no record")
        return read_hash(
            cls, raw, f"approval request {request_id or _text(raw.get(b'id', '?'), 'replace')}"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
