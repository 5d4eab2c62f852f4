"""The reply channel: approval requests as records in Redis, and decisions on them.

A request records the exact call and the sha256 of its canonical arguments; a decision must
name that hash. The first decision wins. A decision on a parked turn marks the turn for
resumption in the same script that records it (the dispatch set), so the turn resumes even
if the deciding client dies before it sends the step.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from actfleet.broker.events import ApprovalDecision, encode
from actfleet.broker.keys import Keys
from actfleet.broker.stream import EMIT_LUA, stamp

# Opens one request from a JSON record (fields of `ApprovalRecord`): record, pending indexes.
OPEN_LUA = """
local function open_request(prefix, json)
  local rec = cjson.decode(json)
  local key = prefix .. ':approval:' .. rec.id
  for k, v in pairs(rec) do redis.call('HSET', key, k, tostring(v)) end
  redis.call('HSET', key, 'status', 'pending')
  redis.call('ZADD', prefix .. ':approvals', rec.created_at, rec.id)
  redis.call('ZADD', prefix .. ':approvals:' .. rec.session_id, rec.created_at, rec.id)
  if tonumber(rec.expires_at) > 0 then
    redis.call('ZADD', prefix .. ':approvals:expiry', rec.expires_at, rec.id)
  end
end
"""

OPEN_REQUEST_LUA = (
    EMIT_LUA
    + OPEN_LUA
    + """
open_request(ARGV[1], ARGV[3])
emit(KEYS[1], KEYS[2], ARGV[2], ARGV, 4, 4)
return 1
"""
)

DECIDE_LUA = (
    EMIT_LUA
    + """
local prefix = ARGV[1]
local key = prefix .. ':approval:' .. ARGV[3]
local r = redis.call('HMGET', key, 'status', 'args_sha256', 'expires_at', 'approver',
                     'turn_id', 'session_id', 'scope', 'dispatch')
if not r[1] then return {'unknown', '', ''} end
if r[1] ~= 'pending' then return {'decided', r[1], r[4] or ''} end
local status = ARGV[5]
local blob = ARGV[9]
if status == 'approved' or status == 'rejected' then
  if r[2] ~= ARGV[4] then return {'hash', r[2], ''} end
  local exp = tonumber(r[3])
  if exp and exp > 0 and tonumber(ARGV[8]) >= exp then
    status = 'expired'
    blob = ARGV[10]
  end
end
redis.call('HSET', key, 'status', status, 'approver', ARGV[6], 'reason', ARGV[7],
           'decided_at', ARGV[8])
redis.call('ZREM', prefix .. ':approvals', ARGV[3])
redis.call('ZREM', prefix .. ':approvals:' .. r[6], ARGV[3])
redis.call('ZREM', prefix .. ':approvals:expiry', ARGV[3])
emit(prefix .. ':seq:' .. r[6], prefix .. ':stream:' .. r[6], ARGV[2], {blob}, 1, 1)
redis.call('PUBLISH', prefix .. ':decided', ARGV[3])
if r[7] == 'step' then
  local tk = prefix .. ':turn:' .. r[5]
  local left = redis.call('HINCRBY', tk, 'waiting', -1)
  if (status ~= 'approved' or left <= 0) and redis.call('HGET', tk, 'status') == 'parked' then
    redis.call('HSET', tk, 'status', 'running')
    redis.call('ZADD', prefix .. ':dispatch', ARGV[8], r[8])
    return {status, 'resume', r[8]}
  end
end
return {status, '', ''}
"""
)


class DecisionRefused(ValueError):
    """A decision that was not recorded; the message says why and what to do."""


def args_sha256(tool_name: str, args: dict[str, Any]) -> str:
    """The sha256 of a call's canonical form (sorted keys, no spaces, UTF-8)."""
    canonical = json.dumps(
        {"tool_name": tool_name, "args": args},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def dispatch_member(session_id: str, agent_id: str, turn_id: str, step_no: int, kind: str) -> str:
    """How a step waiting to be (re)sent is named in the dispatch set."""
    return f"{session_id}|{agent_id}|{turn_id}|{step_no}|{kind}"


def parse_dispatch_member(member: str) -> tuple[str, str, str, int, str]:
    session_id, agent_id, turn_id, step_no, kind = member.split("|")
    return session_id, agent_id, turn_id, int(step_no), kind


@dataclass(frozen=True)
class ApprovalRecord:
    """A request for a human decision, as stored in Redis."""

    id: str
    session_id: str
    agent_id: str
    turn_id: str
    kind: str
    """code, shell, tool or subagent."""
    tool_name: str
    args: dict[str, Any]
    args_sha256: str
    created_at: float
    expires_at: float
    """0: never."""
    scope: str = "step"
    """step: decides a parked turn's call; cell: a shell command a running cell waits on."""
    corr_id: str = ""
    dispatch: str = ""
    """The dispatch member of the step that resumes the turn (scope step)."""
    status: str = "pending"
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

    def to_json(self) -> str:
        data = self.__dict__ | {"args": json.dumps(self.args, sort_keys=True)}
        for name in ("status", "approver", "reason", "decided_at"):
            del data[name]
        return json.dumps(data)

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> ApprovalRecord:
        data = {k.decode(): v.decode() for k, v in raw.items()}
        return cls(
            **{
                k: v
                for k, v in data.items()
                if k not in ("args", "created_at", "expires_at", "decided_at")
            },
            args=json.loads(data["args"]),
            created_at=float(data["created_at"]),
            expires_at=float(data["expires_at"]),
            decided_at=float(data.get("decided_at") or 0),
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def decision_events(
    record: ApprovalRecord, *, approved: bool, approver: str, reason: str, node: str = ""
) -> tuple[bytes, bytes]:
    """The ApprovalDecision event blobs for this decision and for expiry (the script picks)."""
    envelope = {
        "session_id": record.session_id,
        "agent_id": record.agent_id,
        "turn_id": record.turn_id,
        "corr_id": record.corr_id,
        "node": node,
    }
    decided = ApprovalDecision(
        **envelope, request_id=record.id, approved=approved, approver=approver, reason=reason
    )
    expired = ApprovalDecision(
        **envelope,
        request_id=record.id,
        approved=False,
        approver="actfleet",
        reason=_expired_reason(record),
    )
    return encode(stamp(decided)), encode(stamp(expired))


def _expired_reason(record: ApprovalRecord) -> str:
    timeout = record.expires_at - record.created_at
    return f"expired: no decision within {timeout:g} s counts as rejected"


def decide_args(
    keys: Keys,
    maxlen: int,
    record: ApprovalRecord,
    *,
    status: str,
    args_sha: str,
    approver: str,
    reason: str,
    node: str = "",
) -> list[Any]:
    """The arguments of the decide script (shared by the sync client and async nodes)."""
    if status == "expired":
        reason = reason or _expired_reason(record)
    decided, expired = decision_events(
        record, approved=status == "approved", approver=approver, reason=reason, node=node
    )
    return [
        keys.prefix,
        maxlen,
        record.id,
        args_sha,
        status,
        approver,
        reason,
        time.time(),
        decided,
        expired,
    ]


def refusal(verdict: str, request_id: str, detail: str, by: str) -> DecisionRefused:
    """The error for a decide script's refusal."""
    if verdict == "unknown":
        return DecisionRefused(
            f"no approval request {request_id!r}; list them with `actfleet approvals`"
        )
    if verdict == "hash":
        return DecisionRefused(
            f"request {request_id} is for arguments with sha256 {detail[:12]}..., not the ones "
            "you decided on; look at it again with `actfleet approvals` and decide on that"
        )
    return DecisionRefused(
        f"request {request_id} was already decided: {detail}"
        + (f" by {by}" if by else "")
        + "; the first decision stands"
    )
