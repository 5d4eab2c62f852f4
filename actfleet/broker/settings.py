"""All settings, read once from `ACTFLEET_*` environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Settings:
    """Every tunable of actfleet; each field is read from `ACTFLEET_<NAME>`."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "actfleet"
    stream_maxlen: int = 10_000
    """Approximate number of events kept per session stream (XADD MAXLEN ~)."""
    chunk_flush_ms: int = 40
    """Chunks are coalesced for this long before they are written to the stream."""
    chunk_flush_bytes: int = 4096
    lease_ttl: float = 10.0
    """Seconds a node's heartbeat and runtime leases live without renewal."""
    heartbeat_interval: float = 2.0
    execution_timeout: float = 300.0
    """Seconds a cell may run (approval waits excluded) before it is interrupted."""
    interrupt_grace: float = 3.0
    """Seconds an interrupted cell has to stop before its kernel is restarted."""
    output_cap: int = 32 * 1024
    """Bytes of cell output shown to the model and in events; the rest is kept in Redis."""
    output_ttl: int = 7 * 24 * 3600
    kernel_start_timeout: float = 60.0
    kernel_start_concurrency: int = 2
    """Kernels started at once on a node (staggered start-up)."""
    warm_kernels: int = 2
    """Fresh kernels a node keeps started and ready."""
    runtime_idle_timeout: float = 1800.0
    """A runtime idle this long is reaped; the model is told its kernel restarted."""
    redispatch_after: float = 10.0
    """Seconds a sent step (a submission, a decision) may wait unclaimed before a node sends
    it again: a client that dies right after writing loses nothing."""
    max_agents: int = 0
    """Subagents running at once across the fleet (0: no fleet-wide cap)."""
    task_events: bool = False
    """Send Celery task events from the start (Flower switches them on itself when it runs;
    they cost each step a few ms)."""
    model_timeout: float = 600.0
    model_retries: int = 4
    """Retries of a model request that failed with a transient error (429, 5xx, a timeout, a
    lost connection) within one model step; 0: none."""
    model_retry_base: float = 1.0
    """Seconds before the first retry; each next one waits twice as long (with jitter), or
    as long as the provider's Retry-After says when that is longer."""
    model_retry_max_delay: float = 60.0
    """The longest wait before a retry (a longer Retry-After is cut to this)."""
    visibility_timeout: int = 3600
    """Celery/Redis visibility timeout; above the longest step."""
    workdir: str = ""
    """Root of the runtimes' working directories (default: a temp dir per node)."""
    keep_workdirs: bool = False
    """Keep a runtime's working directory when the runtime is released (default: removed)."""
    retention: float = 7 * 24 * 3600.0
    """Seconds a finished session's keys are kept after its last turn ended (0: forever)."""
    redis_retry_seconds: float = 30.0
    """How long a Redis command keeps retrying a lost connection (with backoff) before it
    fails: a Redis restart shorter than this loses nothing."""
    dead_letters_max: int = 10_000
    """Dead letters kept (newest first)."""
    sandbox: bool = True
    """Run kernels in a bubblewrap sandbox (docs/security.md); off only by --no-sandbox."""
    kernel_network: str = "full"
    """A kernel's network: full (the host's) or none (a loopback of its own)."""
    kernel_memory: int = 4 * 1024**3
    """Bytes of memory a kernel may use: all its processes together where it has a cgroup,
    else address space per process (0: no limit)."""
    kernel_procs: int = 256
    """Processes and threads a kernel may run at once (0: no limit)."""
    kernel_files: int = 1024
    """Files a kernel process may hold open (0: no limit)."""
    kernel_file_size: int = 1024**3
    """Bytes a file a kernel writes may reach (0: no limit)."""
    kernel_cgroups: bool = True
    """Give each kernel a cgroup of its own (memory and processes of all its processes
    together) where the node may create cgroups; rlimits only when false or impossible."""
    kernel_uid_base: int = 200_000
    """A node running as root runs each kernel as its own uid from here up."""
    mcp_config: str = ""
    """Path of the node's MCP servers file (`{"mcpServers": {...}}`; docs/mcp.md)."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(f"ACTFLEET_{f.name.upper()}")
            if raw is None or raw == "":
                continue
            kind = type(f.default)
            try:
                values[f.name] = _parse_bool(raw) if kind is bool else kind(raw)
            except ValueError:
                raise SettingsError(
                    f"ACTFLEET_{f.name.upper()}={raw!r} is not a valid {kind.__name__}; "
                    f"unset it or give a {kind.__name__} (default {f.default!r})"
                ) from None
        return cls(**values)


def _parse_bool(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


class SettingsError(ValueError):
    """An ACTFLEET_* variable holds a value of the wrong kind."""


def settings() -> Settings:
    """The settings of this process, from its environment."""
    return Settings.from_env()
