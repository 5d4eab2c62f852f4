"""Property tests of every decoder (events, replay lines, rules files and policies, approval and
other records, step arguments): a valid value encodes and decodes to itself, and junk either
decodes to a well-typed value or raises the decoder's one documented error, never another."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.connection import Encoder

from actfleet.broker import events as ev
from actfleet.broker.ids import ID_PATTERN
from actfleet.broker.policy import KINDS, Policy, PolicyError, Rule, load_policy
from actfleet.broker.records import (
    STEP_KINDS,
    AgentRecord,
    ApprovalRecord,
    BadRecord,
    StepRef,
    TurnRecord,
    hash_fields,
    read_hash,
)
from actfleet.broker.replay import ReplayError, ReplayStep, ReplayToolCall, parse_replay
from actfleet.broker.stream import entries_to_events

PROPERTIES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEEP_JSON = "[" * 50_000
HUGE_INT = "1" * 5_000

# ---- strategies ------------------------------------------------------------------------

text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
"""Text that can be written anywhere (UTF-8 has no lone surrogates)."""
ids = st.from_regex(ID_PATTERN, fullmatch=True)
stream_ids = st.from_regex(r"[0-9]{1,13}-[0-9]{1,4}", fullmatch=True)
int64 = st.integers(-(2**63), 2**63 - 1)
floats = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    st.none() | st.booleans() | int64 | floats | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
"""What JSON and msgpack both carry unchanged."""
json_objects = st.dictionaries(text, json_values, max_size=4)
junk = st.recursive(
    st.none() | st.booleans() | int64 | st.floats() | st.text() | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text() | st.binary(), inner, max_size=4)
    ),
    max_leaves=12,
)
"""Anything a msgpack message can hold: every shape, every type, NaN, bytes."""
json_junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
"""Anything a JSON document can hold: every shape, unbounded integers, NaN, infinities."""

_BY_ANNOTATION: dict[str, st.SearchStrategy[Any]] = {
    "str": text,
    "int": int64,
    "float": floats,
    "bool": st.booleans(),
    "list[str]": st.lists(text, max_size=4),
    "dict[str, Any]": json_objects,
    "dict[str, int]": st.dictionaries(text, int64, max_size=4),
    "float | None": st.none() | floats,
    "dict[str, int | float | None]": st.dictionaries(text, st.none() | int64 | floats, max_size=4),
}


def _fields_of(cls: type, **fixed: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Instances of a dataclass with every field drawn from its declared type."""
    return st.builds(
        cls,
        **{f.name: fixed.get(f.name, _BY_ANNOTATION[str(f.type)]) for f in dataclasses.fields(cls)},
    )


def _well_typed(value: Any, annotation: str) -> bool:
    """Whether a value has a declared field type, element types included."""
    match annotation:
        case "str" | "bool":
            return type(value) is (str if annotation == "str" else bool)
        case "int":
            return isinstance(value, int) and not isinstance(value, bool)
        case "float":
            return isinstance(value, int | float) and not isinstance(value, bool)
        case "list[str]":
            return isinstance(value, list) and all(isinstance(v, str) for v in value)
        case "dict[str, Any]":
            return isinstance(value, dict) and all(isinstance(k, str) for k in value)
        case "dict[str, int]":
            return _well_typed(value, "dict[str, Any]") and all(
                _well_typed(v, "int") for v in value.values()
            )
        case "float | None":
            return value is None or _well_typed(value, "float")
        case "dict[str, int | float | None]":
            return _well_typed(value, "dict[str, Any]") and all(
                _well_typed(v, "float | None") for v in value.values()
            )
    raise AssertionError(f"no check for {annotation}")


def _assert_well_typed(record: Any) -> None:
    for f in dataclasses.fields(record):
        assert _well_typed(getattr(record, f.name), str(f.type)), (f.name, record)


# ---- events ----------------------------------------------------------------------------

EVENT_TYPES = sorted(
    (cls for cls in ev.Event.types.values() if cls is not ev.Unreadable), key=lambda c: c.__name__
)
events = st.one_of(
    [_fields_of(cls, session_id=ids, seq=st.integers(0, 2**63 - 1)) for cls in EVENT_TYPES]
)


@PROPERTIES
@given(events, stream_ids)
def test_every_event_decodes_to_itself(event: ev.Event, stream_id: str):
    event = dataclasses.replace(event, id=stream_id)
    assert ev.decode(ev.encode(event), seq=event.seq, stream_id=stream_id) == event


def _decodes_or_value_error(blob: bytes) -> None:
    try:
        event = ev.decode(blob, seq=1, stream_id="1-0")
    except ValueError:
        return
    assert type(event) in EVENT_TYPES
    _assert_well_typed(event)


@PROPERTIES
@given(st.binary())
@example(b"\xc1")
@example(b"\x91" * 5_000)
def test_junk_bytes_decode_or_raise_value_error(blob: bytes):
    _decodes_or_value_error(blob)


@PROPERTIES
@given(junk)
def test_junk_msgpack_decodes_or_raises_value_error(value: Any):
    _decodes_or_value_error(msgpack.packb(value, use_bin_type=True))


@PROPERTIES
@given(
    st.sampled_from(sorted(ev.Event.types)),
    st.dictionaries(
        st.sampled_from(sorted({f.name for c in EVENT_TYPES for f in dataclasses.fields(c)})),
        junk,
    ),
)
@example("ToolCall", {"session_id": "s", "tool_name": "t", "args": {b"k": 1}})
@example("CodeExecutionOutput", {"session_id": "s", "text": "", "images": [1]})
@example("TurnFinished", {"session_id": "s", "usage": {"input_tokens": "many"}})
def test_events_with_wrong_field_types_decode_or_raise_value_error(
    type_name: str, fields: dict[str, Any]
):
    _decodes_or_value_error(msgpack.packb({"type": type_name, **fields}, use_bin_type=True))


@PROPERTIES
@given(
    st.lists(
        st.tuples(
            stream_ids.map(str.encode),
            st.dictionaries(st.sampled_from([b"e", b"seq", b"x"]) | st.binary(), st.binary()),
        ),
        max_size=5,
    )
)
def test_stream_entries_always_read_as_events_or_notices(entries: list[Any]):
    read = entries_to_events("s", entries)
    assert len(read) == len(entries) and all(isinstance(e, ev.Event) for e in read)


# ---- replay lines ----------------------------------------------------------------------

tool_calls = st.lists(st.builds(ReplayToolCall, text.filter(bool), json_objects), max_size=3).map(
    tuple
)
replay_steps = st.builds(
    ReplayStep,
    thinking=st.none() | text,
    text=st.none() | text,
    code=st.none() | text,
    tool_calls=tool_calls,
    agent=st.sampled_from(["main", "sub"]),
).filter(lambda s: s.text is not None or s.code is not None or s.tool_calls)


def _replay_line(step: ReplayStep, ensure_ascii: bool) -> str:
    """A step as a recorder writes it: only the keys it has."""
    obj: dict[str, Any] = {
        key: getattr(step, key)
        for key in ("thinking", "text", "code")
        if getattr(step, key) is not None
    }
    if step.tool_calls:
        obj["tool_calls"] = [{"name": c.name, "args": c.args} for c in step.tool_calls]
    if step.agent == "sub":
        obj["agent"] = "sub"
    return json.dumps(obj, ensure_ascii=ensure_ascii)


@PROPERTIES
@given(
    st.lists(replay_steps, min_size=1, max_size=5).filter(
        lambda steps: any(s.agent == "main" for s in steps)
    ),
    st.booleans(),
    st.sampled_from(["\n", "\r\n"]),
)
@example([ReplayStep(None, "a\u2028b\x85c", None, (), "main")], False, "\n")
def test_every_replay_script_parses_to_its_steps(
    steps: list[ReplayStep], ensure_ascii: bool, newline: str
):
    script = newline.join(_replay_line(step, ensure_ascii) for step in steps) + newline
    expected = [dataclasses.replace(step, line=n) for n, step in enumerate(steps, 1)]
    assert parse_replay(script, "r.jsonl") == expected


def _parses_or_replay_error(script: str) -> None:
    try:
        steps = parse_replay(script, "r.jsonl")
    except ReplayError:
        return
    assert steps and any(s.agent == "main" for s in steps)
    for step in steps:
        assert all(v is None or isinstance(v, str) for v in (step.thinking, step.text, step.code))
        assert all(isinstance(c.name, str) and isinstance(c.args, dict) for c in step.tool_calls)


@PROPERTIES
@given(st.text())
@example(DEEP_JSON)
@example('{"text": ' + HUGE_INT + "}")
def test_junk_text_parses_or_raises_replay_error(script: str):
    _parses_or_replay_error(script)


@PROPERTIES
@given(
    st.lists(
        json_junk
        | st.dictionaries(
            st.sampled_from(["thinking", "text", "code", "tool_calls", "agent"]),
            json_junk,
            max_size=4,
        ),
        max_size=4,
    )
)
def test_junk_json_lines_parse_or_raise_replay_error(values: list[Any]):
    _parses_or_replay_error("\n".join(json.dumps(v) for v in values))


# ---- rules files and policies ----------------------------------------------------------

rules = st.builds(Rule, st.sampled_from(KINDS), text)
rule_lists = st.lists(rules, max_size=4).map(tuple)
policies = st.builds(
    Policy, mode=st.just("rules"), deny=rule_lists, ask=rule_lists, allow=rule_lists
)


def _toml_string(value: str) -> str:
    """A TOML basic string (control characters, quote and backslash escaped)."""
    return (
        '"'
        + "".join(
            f"\\u{ord(ch):04x}" if ch in '"\\' or ord(ch) < 0x20 or ord(ch) == 0x7F else ch
            for ch in value
        )
        + '"'
    )


def _load_rules(content: bytes) -> Policy:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rules.toml"
        path.write_bytes(content)
        return load_policy(str(path))


@PROPERTIES
@given(policies)
def test_every_rules_file_loads_to_its_policy(policy: Policy):
    lines = [
        f"{name} = [{', '.join(_toml_string(str(r)) for r in getattr(policy, name))}]"
        for name in ("deny", "ask", "allow")
    ]
    assert _load_rules("\n".join(lines).encode()) == policy


@PROPERTIES
@given(policies | st.builds(Policy, mode=st.sampled_from(["auto", "ask"])))
def test_every_policy_survives_its_wire_form(policy: Policy):
    assert Policy.from_data(json.loads(json.dumps(policy.to_data()))) == policy


def _loads_or_policy_error(content: bytes) -> None:
    try:
        policy = _load_rules(content)
    except PolicyError:
        return
    assert policy.mode == "rules"
    assert all(isinstance(r, Rule) for r in policy.deny + policy.ask + policy.allow)


@PROPERTIES
@given(st.binary())
@example(b"\xff\xfe")
@example(b"deny = " + DEEP_JSON.encode())
@example(b"deny = " + HUGE_INT.encode())
def test_junk_rules_files_load_or_raise_policy_error(content: bytes):
    _loads_or_policy_error(content)


@PROPERTIES
@given(st.dictionaries(st.sampled_from(["deny", "ask", "allow", "mode", "other"]), json_values))
def test_rules_files_of_any_shape_load_or_raise_policy_error(data: dict[str, Any]):
    # JSON values are TOML values except null and objects: those lines are TOML junk.
    _loads_or_policy_error("\n".join(f"{k} = {json.dumps(v)}" for k, v in data.items()).encode())


@PROPERTIES
@given(
    json_values
    | st.dictionaries(st.sampled_from(["deny", "ask", "allow", "mode", "other"]), json_values)
)
def test_junk_policy_data_decodes_or_raises_policy_error(data: Any):
    try:
        policy = Policy.from_data(data)
    except PolicyError:
        return
    assert policy.mode in ("auto", "ask", "rules")
    assert all(isinstance(r, Rule) for r in policy.deny + policy.ask + policy.allow)


# ---- approval requests and the other records -------------------------------------------

_encoder = Encoder("utf-8", "strict", False)


def _as_stored(record: Any) -> dict[bytes, bytes]:
    """A record as HSET stores it and HGETALL returns it (redis-py's encoding)."""
    return {_encoder.encode(k): _encoder.encode(v) for k, v in hash_fields(record).items()}


RECORDS = [ApprovalRecord, TurnRecord, AgentRecord]


@PROPERTIES
@given(st.one_of([_fields_of(cls) for cls in RECORDS]))
def test_every_record_reads_back_as_itself(record: Any):
    assert read_hash(type(record), _as_stored(record), "record") == record


@PROPERTIES
@given(_fields_of(ApprovalRecord))
def test_every_approval_request_reads_back_as_itself(record: ApprovalRecord):
    assert ApprovalRecord.from_hash(_as_stored(record), record.id) == record


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


stored_junk = st.binary() | st.sampled_from(
    [b"", b"inf", b"-inf", b"nan", b"1e400", b"[]", b"{}", b"null", b"\xff", DEEP_JSON.encode()]
)


@PROPERTIES
@given(
    st.sampled_from(RECORDS).flatmap(
        lambda cls: st.tuples(
            st.just(cls),
            st.dictionaries(
                st.sampled_from([n.encode() for n in _field_names(cls)]) | st.binary(),
                stored_junk | text.map(str.encode),
            ),
        )
    )
)
@example((TurnRecord, {b"step_no": HUGE_INT.encode()}))
@example((ApprovalRecord, {b"\xff": b"x"}))
def test_junk_records_read_or_raise_bad_record(case: tuple[type, dict[bytes, bytes]]):
    cls, raw = case
    try:
        record = (
            ApprovalRecord.from_hash(raw, "a-1")
            if cls is ApprovalRecord
            else read_hash(cls, raw, "record")
        )
    except BadRecord:
        return
    _assert_well_typed(record)


@PROPERTIES
@given(_fields_of(ApprovalRecord), st.sampled_from(_field_names(ApprovalRecord)), stored_junk)
def test_an_approval_request_with_one_junk_field_reads_or_raises_bad_record(
    record: ApprovalRecord, name: str, value: bytes
):
    raw = _as_stored(record) | {name.encode(): value}
    with contextlib.suppress(BadRecord):
        _assert_well_typed(ApprovalRecord.from_hash(raw, record.id))


# ---- step references: Celery task arguments and dispatch members -----------------------

step_refs = st.builds(StepRef, ids, ids, ids, st.integers(1, 999_999), st.sampled_from(STEP_KINDS))


@PROPERTIES
@given(step_refs)
def test_every_step_reference_decodes_to_itself(ref: StepRef):
    assert StepRef.decode(ref.encode()) == ref
    assert StepRef.decode(ref.encode().encode()) == ref


step_ref_junk = junk | st.lists(
    st.text() | ids | st.sampled_from(STEP_KINDS) | st.integers(0, 10**7).map(str),
    min_size=3,
    max_size=7,
).map("|".join)


@PROPERTIES
@given(step_ref_junk)
@example("s|main|t|\u00b2|model")
@example("s|main|t|\u0661|model")
def test_junk_step_references_decode_or_raise_bad_record(value: Any):
    try:
        ref = StepRef.decode(value)
    except BadRecord:
        return
    assert StepRef.decode(ref.encode()) == ref


@pytest.fixture(scope="module")
def step_tasks() -> dict[str, Any]:
    """The step tasks' bodies, bound to a stand-in node that records what they did."""
    from actfleet.workers.tasks import _runner

    node = SimpleNamespace(ran=[], dead=[])
    node.call = lambda done: done
    node.steps = SimpleNamespace(run=node.ran.append)
    node.ctx = SimpleNamespace(dead_letter=lambda *letter: node.dead.append(letter))
    return {"node": node, **{kind: _runner(node, kind) for kind in STEP_KINDS}}


@PROPERTIES
@given(step_refs)
def test_a_step_task_runs_the_step_its_argument_names(step_tasks: dict[str, Any], ref: StepRef):
    node = step_tasks["node"]
    node.ran.clear()
    step_tasks[ref.kind](None, ref.encode())
    assert node.ran == [ref]


@PROPERTIES
@given(
    st.sampled_from(STEP_KINDS),
    st.lists(step_ref_junk, max_size=3),
    st.dictionaries(st.text(max_size=5), junk, max_size=2),
)
@example("model", [{b"k": 1}], {})
@example("model", ["s|main|t|1|model"], {"task": 1})
@example("model", ["s|main|t|1|execution"], {})
def test_a_step_task_with_junk_arguments_runs_its_step_or_dead_letters_them(
    step_tasks: dict[str, Any], kind: str, args: list[Any], kwargs: dict[str, Any]
):
    node = step_tasks["node"]
    node.ran.clear()
    node.dead.clear()
    step_tasks[kind](None, *args, **kwargs)
    if node.ran:
        assert not node.dead and [r.kind for r in node.ran] == [kind]
    else:
        [(source, body, reason)] = node.dead
        assert source == "step" and isinstance(body, str) and reason.startswith("malformed")
