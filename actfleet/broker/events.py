"""The agent events: one frozen dataclass per type, and their msgpack codec.

Every event carries the same envelope (session, agent, turn, correlation ids, `seq`, `ts`,
`node`); `seq` is assigned by Redis when the event is written and `id` is its stream id,
the cursor a client resumes from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack


@dataclass(frozen=True, kw_only=True)
class Event:
    """The envelope every event carries."""

    session_id: str
    agent_id: str = "main"
    turn_id: str = ""
    corr_id: str = ""
    parent_corr_id: str = ""
    seq: int = 0
    ts: float = 0.0
    node: str = ""
    id: str = ""
    """The stream id (resume cursor); set when read back, never written."""

    types: ClassVar[dict[str, type[Event]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Event.types[cls.__name__] = cls

    @property
    def type(self) -> str:
        return type(self).__name__

    def to_dict(self) -> dict[str, Any]:
        """The event as plain data, `type` first (the JSON form `--json` prints)."""
        data = {"type": self.type}
        for f in dataclasses.fields(self):
            data[f.name] = getattr(self, f.name)
        return data


@dataclass(frozen=True, kw_only=True)
class TurnStarted(Event):
    prompt: str
    model: str


@dataclass(frozen=True, kw_only=True)
class ThoughtsChunk(Event):
    content: str


@dataclass(frozen=True, kw_only=True)
class Thoughts(Event):
    content: str


@dataclass(frozen=True, kw_only=True)
class ResponseChunk(Event):
    content: str


@dataclass(frozen=True, kw_only=True)
class Response(Event):
    content: str


@dataclass(frozen=True, kw_only=True)
class CodeAction(Event):
    """The model asked to run this code (`corr_id` is the tool call id)."""

    code: str


@dataclass(frozen=True, kw_only=True)
class ToolCall(Event):
    """The model asked to call a JSON tool (`corr_id` is the tool call id)."""

    tool_name: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class CodeExecutionOutputChunk(Event):
    text: str


@dataclass(frozen=True, kw_only=True)
class CodeExecutionOutput(Event):
    """A cell's result: `text` is what the model sees; a truncated output is kept in full
    under `output_ref`. `images` are the paths of the images the cell displayed, relative to
    the agent's working directory (`images/<sha256>.<ext>`: png, jpg or svg); each is also
    kept in Redis under its file name (`Keys.image`) for readers away from the node."""

    text: str
    images: list[str] = field(default_factory=list)
    truncated: bool = False
    output_ref: str = ""
    lines: int = 0
    """Lines of the whole output (of which a truncated `text` is a preview)."""
    status: str = "ok"
    """ok, error, interrupted, restarted, died or lost (its node died while it ran)."""


@dataclass(frozen=True, kw_only=True)
class ToolOutput(Event):
    tool_name: str
    content: str
    truncated: bool = False
    """`content` is a head...tail preview; the whole result is kept under `output_ref`."""
    output_ref: str = ""


@dataclass(frozen=True, kw_only=True)
class KernelRestarted(Event):
    """The agent's runtime was rebuilt (node died, runtime reaped): kernel state was lost."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class ApprovalRequest(Event):
    request_id: str
    kind: str
    tool_name: str
    args: dict[str, Any]
    args_sha256: str
    expires_at: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ApprovalDecision(Event):
    request_id: str
    approved: bool
    approver: str
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class SubagentStarted(Event):
    subagent_id: str
    prompt: str


@dataclass(frozen=True, kw_only=True)
class SubagentFinished(Event):
    subagent_id: str
    status: str
    response: str = ""


@dataclass(frozen=True, kw_only=True)
class Usage(Event):
    """Tokens and cost of one model step."""

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 1
    cost: float | None = None
    """USD, from the price table; None: the model's price is unknown (never shown as 0)."""


@dataclass(frozen=True, kw_only=True)
class ModelRetry(Event):
    """A model request failed with a transient error (429, 5xx, a timeout, a lost
    connection) and is made again after `delay` seconds."""

    attempt: int
    """The attempt that failed (1 for the first) within the model step."""
    max_attempts: int
    delay: float
    error: str
    """One line, secrets stripped."""
    discarded: bool = False
    """The failed attempt had streamed chunks already; they are superseded by the retry's."""


@dataclass(frozen=True, kw_only=True)
class TurnFinished(Event):
    reason: str = "completed"
    """completed, rejected, max_turns or budget."""
    response: str = ""
    usage: dict[str, int | float | None] = field(default_factory=dict)
    """input_tokens, output_tokens, requests (subagents included), cost (USD of the steps
    with a known price; None when no step had one) and unpriced (steps whose price is
    unknown: with any, cost is a lower bound)."""
    attempts: int = 1
    """1 + the model requests retried in the turn."""


@dataclass(frozen=True, kw_only=True)
class TurnFailed(Event):
    error: str
    usage: dict[str, int | float | None] = field(default_factory=dict)
    """As `TurnFinished.usage`."""
    attempts: int = 1
    error_kind: str = ""
    """transient (retries ran out) or permanent (a bad key, an unknown model, a rejected
    request: retrying would not help)."""


@dataclass(frozen=True, kw_only=True)
class Cancelled(Event):
    phase: str = ""


@dataclass(frozen=True, kw_only=True)
class Unreadable(Event):
    """A stream entry that could not be decoded; readers show it as a notice and go on."""

    reason: str


TERMINAL = (TurnFinished, TurnFailed, Cancelled)


def encode(event: Event) -> bytes:
    """msgpack of the event's fields without `seq` and `id`, which Redis assigns."""
    data = event.to_dict()
    del data["seq"], data["id"]
    return msgpack.packb(data, use_bin_type=True)


def decode(blob: bytes, *, seq: int, stream_id: str) -> Event:
    """The event a stream entry holds; unknown fields (from newer writers) are ignored.
    ValueError (naming the entry and the fault) for anything that is not an event."""
    try:
        data = msgpack.unpackb(blob, raw=False)
    except Exception as exc:
        raise ValueError(f"stream entry {stream_id} is not msgpack ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"stream entry {stream_id} is a {type(data).__name__}, not an event")
    cls = Event.types.get(str(data.pop("type", "")))
    if cls is None or cls is Unreadable:
        raise ValueError(f"stream entry {stream_id} has an unknown event type")
    names = {f.name for f in dataclasses.fields(cls)} - {"seq", "id"}
    kwargs = {k: v for k, v in data.items() if k in names}
    try:
        event = cls(**kwargs, seq=seq, id=stream_id)
    except TypeError as exc:
        raise ValueError(f"stream entry {stream_id}: {exc}") from None
    for f in dataclasses.fields(event):
        if not _has_type(getattr(event, f.name), f.type):
            raise ValueError(f"stream entry {stream_id}: field {f.name!r} has the wrong type")
    return event


_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "list[str]": (list,),
    "dict[str, Any]": (dict,),
    "dict[str, int]": (dict,),
    "float | None": (int, float, type(None)),
    "int | float | None": (int, float, type(None)),
    "dict[str, int | float | None]": (dict,),
}
_ITEMS: dict[str, str] = {
    "list[str]": "str",
    "dict[str, int]": "int",
    "dict[str, int | float | None]": "int | float | None",
}
"""The declared type of a container field's items (a dict's keys are always `str`)."""


def _has_type(value: Any, annotation: Any) -> bool:
    """Whether a decoded field has its declared type, items and keys included (annotations
    are strings here)."""
    name = str(annotation)
    expected = _TYPES.get(name)
    if expected is None:
        return True
    if not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected):
        return False
    if isinstance(value, dict) and not all(isinstance(key, str) for key in value):
        return False
    items = value.values() if isinstance(value, dict) else value
    return name not in _ITEMS or all(_has_type(item, _ITEMS[name]) for item in items)
