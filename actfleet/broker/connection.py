"""Redis clients, made in one place: every client retries lost connections with backoff
and checks pooled connections' health, so a Redis restart is a pause, not an error."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.backoff import ExponentialBackoff

from actfleet.broker.settings import Settings

_BACKOFF_CAP = 0.5
"""Seconds between retries at most."""


def _options(settings: Settings, retry_type: type) -> dict[str, Any]:
    retries = max(1, int(settings.redis_retry_seconds / _BACKOFF_CAP) + 4)

    class Retry(retry_type):  # type: ignore[misc,valid-type]
        """Retries lost connections, not refused credentials (redis-py's
        AuthenticationError is a ConnectionError): a wrong password fails at once."""

        def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):  # noqa: ANN001, ANN202
            def retryable(error: Exception) -> bool:
                if isinstance(error, redis.AuthenticationError):
                    return False
                return is_retryable is None or is_retryable(error)

            return super().call_with_retry(do, fail, retryable, with_failure_count)

    return {
        "retry": Retry(ExponentialBackoff(cap=_BACKOFF_CAP, base=0.05), retries),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        "health_check_interval": 10,
        "socket_connect_timeout": 3,
        "socket_keepalive": True,
    }


def sync_redis(settings: Settings, url: str | None = None) -> redis.Redis:
    """A synchronous client (the SDK and the CLI)."""
    from redis.retry import Retry

    return redis.Redis.from_url(url or settings.redis_url, **_options(settings, Retry))


def async_redis(settings: Settings, url: str | None = None) -> aioredis.Redis:
    """An asyncio client (nodes, async SDK readers)."""
    from redis.asyncio.retry import Retry

    return aioredis.Redis.from_url(url or settings.redis_url, **_options(settings, Retry))


def open_to_anyone(url: str) -> bool:
    """Whether the Redis at `url` answers a client that gives no credentials (then any
    process that reaches its port, a kernel with network included, can use it)."""
    pool = redis.Redis.from_url(url).connection_pool
    anonymous = {
        k: v for k, v in pool.connection_kwargs.items() if k not in ("username", "password")
    }
    client = redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **anonymous)
    )
    try:
        client.ping()
    except redis.AuthenticationError:
        return False
    except redis.ResponseError as exc:
        if str(exc).startswith(("NOAUTH", "NOPERM")):
            return False
        raise
    finally:
        client.close()
    return True
