"""What users hold: the Python SDK, the CLI and the demo. Never imports the worker code."""

from actfleet.broker.approvals import DecisionRefused
from actfleet.broker.policy import Policy, PolicyError
from actfleet.broker.records import ApprovalRecord
from actfleet.client.sdk import (
    Client,
    Handle,
    RedisUnavailable,
    TurnResult,
    UnknownSession,
    is_terminal_for,
)

__all__ = [
    "ApprovalRecord",
    "Client",
    "DecisionRefused",
    "Handle",
    "Policy",
    "PolicyError",
    "RedisUnavailable",
    "TurnResult",
    "UnknownSession",
    "is_terminal_for",
]
