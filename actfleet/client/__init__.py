"""What users hold: the Python SDK, the CLI and the demo. Never imports the worker code."""

from actfleet.broker.approvals import DecisionRefused
from actfleet.broker.batches import BatchFileError, BatchRecord
from actfleet.broker.policy import Policy, PolicyError
from actfleet.broker.records import ApprovalRecord
from actfleet.client.batch import Batch, BatchProgress, UnknownBatch
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
    "Batch",
    "BatchFileError",
    "BatchProgress",
    "BatchRecord",
    "Client",
    "DecisionRefused",
    "Handle",
    "Policy",
    "PolicyError",
    "RedisUnavailable",
    "TurnResult",
    "UnknownBatch",
    "UnknownSession",
    "is_terminal_for",
]
