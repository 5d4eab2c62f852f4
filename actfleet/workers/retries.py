"""Retries of failed model requests: which errors are transient, how long to wait (backoff
with jitter, or the provider's Retry-After), and the retry loop of one model step.

Provider SDKs retry on their own; actfleet turns that off (`max_retries=0` in
`stream_response`) and retries here, so each retry is counted in the turn's attempts and
shown as a `ModelRetry` event, and a cancellation interrupts the wait at once.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Literal, TypeVar

import httpx
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelConnectionError,
    ModelHTTPError,
    ModelQuotaExceededError,
    ModelRateLimitError,
    ModelRequestRejectedError,
    ModelRequestTimeout,
    ModelServerError,
    ModelUnavailableError,
)

from actfleet.broker.settings import Settings
from actfleet.workers.models import ModelCallError

T = TypeVar("T")

ErrorKind = Literal["transient", "permanent"]
"""transient: the same request may succeed later (retried); permanent: it will not (a bad
key, an unknown model, a rejected request, an exhausted quota), so the turn fails at once."""

TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504, 529})
"""HTTP statuses worth a retry when the provider's error has no category of its own."""


def error_kind(error: ModelCallError) -> ErrorKind:
    """Whether a failed model request is worth retrying, from the provider error behind it
    (a `ModelCallError` without one, such as a played-out replay script, is permanent)."""
    match error.__cause__:
        case ModelQuotaExceededError() | ModelRequestRejectedError():
            return "permanent"
        case (
            ModelRateLimitError()
            | ModelUnavailableError()
            | ModelServerError()
            | ModelConnectionError()
            | ModelRequestTimeout()
        ):
            return "transient"
        case ModelHTTPError(status_code=status):
            return "transient" if status in TRANSIENT_STATUS or status >= 500 else "permanent"
        case httpx.TransportError() | ConnectionError() | TimeoutError():
            return "transient"
    return "permanent"


def retry_after(error: ModelCallError, now: float | None = None) -> float | None:
    """Seconds the provider asked to wait before a retry (`retry-after-ms` or `Retry-After`
    headers, else what pydantic-ai read from the error), or None when it did not say."""
    cause = error.__cause__
    headers: Mapping[str, str] = {}
    if isinstance(cause, ModelHTTPError) and cause.headers:
        headers = cause.headers
    millis = _seconds(headers.get("retry-after-ms", ""))
    if millis is not None:
        return millis / 1000
    if "retry-after" in headers:
        return parse_retry_after(headers["retry-after"], now)
    if isinstance(cause, ModelAPIError):
        return cause.retry_after
    return None


def parse_retry_after(value: str, now: float | None = None) -> float | None:
    """A Retry-After value in seconds: delay-seconds (`120`, `1.5`) or an HTTP date (the
    time left until then, 0 when it has passed); None when it is neither."""
    seconds = _seconds(value)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT; an obsolete form parses without a zone
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _seconds(value: str) -> float | None:
    """A non-negative finite number, or None."""
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a model step retries transient errors."""

    retries: int
    """Retries after the first attempt."""
    base: float
    max_delay: float

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        return cls(
            max(settings.model_retries, 0),
            settings.model_retry_base,
            settings.model_retry_max_delay,
        )

    def delay(self, retry: int, asked: float | None = None) -> float:
        """Seconds before retry number `retry` (1 for the first): exponential backoff with
        jitter (between half and all of base * 2^(retry-1)), never shorter than what the
        provider asked (`asked`), never longer than `max_delay`."""
        backoff = self.base * 2 ** min(retry - 1, 60) * random.uniform(0.5, 1.0)
        return min(self.max_delay, max(backoff, asked or 0.0))


OnRetry = Callable[[int, float, ModelCallError], Awaitable[None]]
"""Told before each wait: the attempt that failed (1 for the first), the delay, the error."""


async def with_retries(
    attempt: Callable[[], Awaitable[T]], policy: RetryPolicy, on_retry: OnRetry
) -> T:
    """`attempt()` until it succeeds, fails with a permanent error (raised at once), or has
    failed `1 + policy.retries` times with transient errors (the last error is raised, saying
    how many attempts were made). Cancelling the caller cancels a wait at once."""
    failed = 0
    while True:
        try:
            return await attempt()
        except ModelCallError as error:
            failed += 1
            if error_kind(error) == "permanent" or policy.retries == 0:
                raise
            if failed > policy.retries:
                gave_up = ModelCallError(f"{error} (gave up after {failed} attempts)")
                raise gave_up from error.__cause__
            delay = policy.delay(failed, retry_after(error))
            await on_retry(failed, delay, error)
            await asyncio.sleep(delay)
