"""What users hold: the Python SDK, the CLI and the demo. Never imports the worker code."""

from actfleet.client.sdk import Client, Handle, RedisUnavailable, TurnResult

__all__ = ["Client", "Handle", "RedisUnavailable", "TurnResult"]
