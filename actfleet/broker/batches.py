"""Batches: a JSONL file of items, each one turn of its own session (or of a session it
continues), worked through at a bounded concurrency by the fleet.

A batch lives in Redis: its record (options, counts, usage), its items (each the turn
payload its start submits), the queue of items not started, the active items (started,
not yet reported), and the results stream (one entry per item, in completion order). The
pump (lua/batch_pump.lua) is the one transition: it reports ended items, applies the
budget, the circuit breaker and item timeouts, and starts queued items while the
concurrency allows. Clients pump after submitting, nodes when an item ends or parks and on
each heartbeat.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from actfleet.broker.ids import BadId, check_id
from actfleet.broker.keys import Keys
from actfleet.broker.model_names import ModelNameError, check_model_name
from actfleet.broker.policy import PolicyError, load_policy
from actfleet.broker.replay import ReplayError, load_replay
from actfleet.broker.settings import Settings
from actfleet.broker.transitions import Call, _now, _pack, text

ITEM_FIELDS = {"custom_id", "prompt", "model", "approval", "max_turns", "session_id", "metadata"}
RESULT_STATUSES = ("completed", "failed", "rejected", "cancelled", "max_turns", "budget", "timeout")
"""How an item ended, as its result says."""
BREAKER_ITEMS = 3
"""The first this many items failing with one and the same non-transient error stop the
batch (the circuit breaker) instead of failing every item the same way."""
CHUNK = 500
"""Items written per round trip when submitting."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class BatchFileError(ValueError):
    """A batch file that cannot be submitted; the message names the line and the field."""


@dataclass(frozen=True)
class BatchItem:
    """One line of a batch file."""

    custom_id: str
    prompt: str
    line: int
    model: str | None = None
    approval: str | None = None
    max_turns: int | None = None
    session_id: str | None = None
    metadata: Any = None


@dataclass(frozen=True)
class BatchOptions:
    """What a batch's submitter chose; stored in the batch record."""

    model: str
    concurrency: int = 32
    approval: str = "auto"
    max_turns: int | None = None
    retries: int | None = None
    item_timeout: float = 0.0
    max_cost: float = 0.0
    max_tokens: int = 0
    priority: int = 0
    agent_options: dict[str, Any] = field(default_factory=dict)


def batch_id(name: str) -> str:
    """The batch id a name gives (the same name, the same batch: submitting again resumes)."""
    if not NAME.fullmatch(name):
        raise BatchFileError(
            f"batch name {name!r} is not valid: use letters, digits and _ . -, starting with a "
            "letter or digit, at most 64 characters"
        )
    return f"b-{name}"


def default_name(path: Path) -> str:
    """A batch's name when none is given: the file's stem, made valid."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", path.stem).lstrip("-_.") or "batch"
    return stem[:64]


def item_ids(batch: str, item: BatchItem) -> tuple[str, str]:
    """The item's session id (its own, or the one it continues) and turn id, derived from
    the batch and `custom_id`, so submitting an item again finds it submitted."""
    digest = hashlib.sha256(f"{batch}\0{item.custom_id}".encode()).hexdigest()
    return item.session_id or f"s-{digest[:20]}", f"t-{digest[20:44]}"


def read_items(path: Path) -> Iterator[BatchItem]:
    """The items of a JSONL batch file, one per non-empty line, each checked on its own
    (BatchFileError naming the line and the field); reads one line at a time."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise BatchFileError(f"{path}: cannot read the batch file ({exc.strerror})") from None
    with handle:
        line_no = 0
        try:
            for line_no, line in enumerate(handle, 1):  # noqa: B007 - read in the except
                if line.strip():
                    yield parse_item(path, line_no, line)
        except UnicodeDecodeError:
            raise BatchFileError(f"{path} line {line_no + 1}: not UTF-8 text") from None


def check_file_items(items: Iterable[BatchItem], resolver: ItemResolver) -> int:
    """Check a whole batch before anything is written: every item, unique `custom_id`s,
    every model, approval and replay file. Returns the number of items."""
    path = resolver.path
    seen: set[str] = set()
    count = 0
    for item in items:
        if item.custom_id in seen:
            raise BatchFileError(
                f"{path} line {item.line}: field 'custom_id': {item.custom_id!r} is used by an "
                "earlier line; give every item its own custom_id"
            )
        seen.add(item.custom_id)
        resolver.model(item)
        resolver.policy(item)
        count += 1
    if not count:
        raise BatchFileError(f"{path}: no items; write one JSON object per line")
    return count


def parse_item(path: Path, line_no: int, line: str) -> BatchItem:
    """One item of a batch file, checked; BatchFileError naming the line and the field."""
    where = f"{path} line {line_no}"
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise BatchFileError(f"{where}: not JSON ({reason}); write one JSON object") from None
    if not isinstance(data, dict):
        raise BatchFileError(f"{where}: a JSON {type(data).__name__}, not an object")
    unknown = sorted(set(data) - ITEM_FIELDS)
    if unknown:
        raise BatchFileError(
            f"{where}: unknown field {unknown[0]!r}; an item has {', '.join(sorted(ITEM_FIELDS))}"
        )
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id.strip() or len(custom_id) > 512:
        raise BatchFileError(
            f"{where}: field 'custom_id' is required: a non-empty string of at most 512 "
            "characters that names the item in its result"
        )
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BatchFileError(f"{where}: field 'prompt' is required: a non-empty string")
    for name in ("model", "approval", "session_id"):
        if name in data and not isinstance(data[name], str):
            raise BatchFileError(f"{where}: field {name!r} must be a string")
    max_turns = data.get("max_turns")
    if max_turns is not None and (
        not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1
    ):
        raise BatchFileError(f"{where}: field 'max_turns' must be a positive integer")
    session_id = data.get("session_id")
    if session_id is not None:
        try:
            check_id(session_id, "session id")
        except BadId as exc:
            raise BatchFileError(f"{where}: field 'session_id': {exc}") from None
    return BatchItem(
        custom_id=custom_id,
        prompt=prompt,
        line=line_no,
        model=data.get("model"),
        approval=data.get("approval"),
        max_turns=max_turns,
        session_id=session_id,
        metadata=data.get("metadata"),
    )


class ItemResolver:
    """Items' models, replay scripts and approval policies, each file read once per
    submission (a batch of 100,000 items names a handful of files); a replay file is found
    next to the batch file."""

    def __init__(self, path: Path, options: BatchOptions):
        self.path, self.options = path, options
        self._replays: dict[str, str] = {}
        self._policies: dict[str, dict[str, Any]] = {}

    def model(self, item: BatchItem) -> str:
        model = item.model or self.options.model
        if model.startswith("replay:"):
            replay = Path(model.removeprefix("replay:"))
            if not replay.is_absolute():
                model = f"replay:{(self.path.parent / replay).resolve()}"
        try:
            check_model_name(model)
            if model.startswith("replay:"):
                self.replay(model)
        except (ModelNameError, ReplayError) as exc:
            raise BatchFileError(f"{self.path} line {item.line}: field 'model': {exc}") from None
        return model

    def replay(self, model: str) -> str:
        """A `replay:` model's script."""
        if model not in self._replays:
            self._replays[model], _ = load_replay(Path(model.removeprefix("replay:")))
        return self._replays[model]

    def policy(self, item: BatchItem) -> dict[str, Any]:
        spec = item.approval or self.options.approval
        if spec not in self._policies:
            try:
                self._policies[spec] = load_policy(spec).to_data()
            except PolicyError as exc:
                where = f"{self.path} line {item.line}: field 'approval'"
                raise BatchFileError(f"{where}: {exc}") from None
        return self._policies[spec]


# ---- the record -----------------------------------------------------------------------


@dataclass(frozen=True)
class BatchRecord:
    """A batch's record (`Keys.batch`), as `batch status` shows it."""

    id: str
    name: str
    model: str
    status: str
    """running, done, cancelled, stopped (the circuit breaker) or budget."""
    created_at: float
    total: int
    concurrency: int
    error: str = ""
    finished_at: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    """Ended items per result status."""
    usage: dict[str, int] = field(default_factory=dict)
    cost: float = 0.0
    """USD of the model requests with a known price."""
    unpriced: int = 0
    """Model requests whose price is unknown (the cost is then a lower bound)."""
    max_cost: float = 0.0
    max_tokens: int = 0

    @classmethod
    def from_hash(cls, batch: str, raw: dict[Any, Any]) -> BatchRecord:
        data = {text(k): text(v) for k, v in raw.items()}
        return cls(
            id=batch,
            name=data.get("name", ""),
            model=data.get("model", ""),
            status=data.get("status", "running"),
            created_at=float(data.get("created_at", 0)),
            total=int(data.get("total", 0)),
            concurrency=int(data.get("concurrency", 0)),
            error=data.get("error", ""),
            finished_at=float(data.get("finished_at", 0)),
            counts={s: int(data.get(f"n_{s}", 0)) for s in RESULT_STATUSES},
            usage={k: int(data.get(k, 0)) for k in ("input_tokens", "output_tokens", "requests")},
            cost=float(data.get("cost", 0)),
            unpriced=int(data.get("unpriced", 0)),
            max_cost=float(data.get("max_cost", 0)),
            max_tokens=int(data.get("max_tokens", 0)),
        )

    @property
    def ended(self) -> int:
        return sum(self.counts.values())

    @property
    def cost_unknown(self) -> bool:
        """No model request had a known price (the cost is unknown, not 0)."""
        return self.unpriced > 0 and self.unpriced >= self.usage["requests"]


def result_line(fields: dict[Any, Any]) -> dict[str, Any]:
    """An item's result (one JSON line of the results file) from its results-stream entry."""
    data = {text(k): text(v) for k, v in fields.items()}
    try:
        metadata = json.loads(data.get("metadata") or "null")
    except json.JSONDecodeError:
        metadata = None
    requests = int(float(data.get("requests") or 0))
    unknown = requests > 0 and int(data.get("unpriced") or 0) >= requests
    return {
        "custom_id": data.get("custom_id", ""),
        "status": data.get("status", ""),
        "response": data.get("response", ""),
        "usage": {
            k: int(float(data.get(k) or 0)) for k in ("input_tokens", "output_tokens", "requests")
        },
        "cost": None if unknown else float(data.get("cost") or 0),
        "session_id": data.get("session_id", ""),
        "error": data.get("error", ""),
        "attempts": int(data.get("attempts") or 1),
        "started_at": float(data.get("started_at") or 0) or None,
        "finished_at": float(data.get("finished_at") or 0) or None,
        "metadata": metadata,
    }


# ---- transitions ----------------------------------------------------------------------


def add_items(
    keys: Keys, batch: str, record: dict[str, Any], items: list[tuple[str, bytes]]
) -> Call[int]:
    """Create or update the batch record and add the items not yet in it (queued, oldest
    last). Returns how many were new. One chunk is atomic: an interrupted submission leaves
    every item either queued or absent, so submitting again completes it."""
    payload = {"now": _now(), "record": {k: str(v) for k, v in record.items()}}
    flat: list[Any] = [_pack(payload)]
    for custom_id, item in items:
        flat.extend((custom_id, item))
    return Call(
        "batch_add",
        [
            keys.batch(batch),
            keys.batch_items(batch),
            keys.batch_queue(batch),
            keys.batches(),
            keys.batches_active(),
        ],
        flat,
        int,
    )


def item_payload(turn_payload: dict[str, Any], item: BatchItem) -> bytes:
    """What a batch stores per item: the turn payload its start submits, with its
    `custom_id` and metadata (returned with its result)."""
    metadata = json.dumps(item.metadata) if item.metadata is not None else ""
    blob = {**turn_payload, "custom_id": item.custom_id, "metadata": metadata}
    return msgpack.packb(blob, use_bin_type=False)


@dataclass(frozen=True)
class Pumped:
    started: list[str]
    """First steps of the items started (to send)."""
    cancel: list[str]
    """Sessions of items past the item timeout (to cancel)."""


def pump(keys: Keys, settings: Settings, batch: str, limit: int = 1000) -> Call[Pumped]:
    """Report ended items, apply budget, breaker and timeouts, start what fits (see
    lua/batch_pump.lua). `limit` bounds the items reported or started in one call."""
    templates = {
        "agent": keys.agent("{S}", "main"),
        "turn": keys.turn("{T}"),
        "queue": keys.turn_queue("{S}", "main"),
        "seq": keys.seq("{S}"),
        "stream": keys.stream("{S}"),
        "session": keys.session("{S}"),
        "turnstart": keys.turn_started("{T}"),
        "agents": keys.session_agents("{S}"),
        "history": keys.history("{S}", "main"),
    }
    payload = {
        "now": _now(),
        "maxlen": settings.stream_maxlen,
        "limit": limit,
        "breaker": BREAKER_ITEMS,
        "templates": templates,
    }

    def parse(reply: Any) -> Pumped:
        return Pumped([text(m) for m in reply[0]], [text(s) for s in reply[1]])

    return Call(
        "batch_pump",
        [
            keys.batch(batch),
            keys.batch_queue(batch),
            keys.batch_active(batch),
            keys.batch_items(batch),
            keys.batch_results(batch),
            keys.batch_done(batch),
            keys.dispatch(),
            keys.sessions(),
            keys.batches_active(),
        ],
        [_pack(payload), batch],
        parse,
    )
