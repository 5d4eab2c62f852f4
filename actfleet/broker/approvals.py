"""The reply channel's rules: the hash a decision must name, and the errors a refused
decision gives. Requests are `ApprovalRecord`s (records.py); opening and deciding them are
transitions (transitions.py: `open_request`, `decide`, and `commit` for a parked turn's)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


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
