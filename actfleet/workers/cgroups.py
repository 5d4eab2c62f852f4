"""A cgroup per kernel, where the node may create cgroups: the memory of all of a kernel's
processes together and their number are bounded by the kernel (the OOM killer ends a kernel
over its memory, not the node). cgroup v2 when the node's cgroup has the memory and pids
controllers and can be divided; cgroup v1 hierarchies where those are mounted and writable.
Elsewhere `node_cgroups` says why not and kernels keep per-process rlimits only (sandbox.py).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("actfleet.cgroups")

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
_ENABLE = " ".join(f"+{c}" for c in CONTROLLERS)
"""What a v2 `cgroup.subtree_control` is given to pass the controllers to its children."""
_ENTER = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
"""Moves the shell into each cgroup named before `--`, then runs the command: everything
the command starts is in the kernel's cgroups from its first instruction."""


class CgroupsUnavailable(RuntimeError):
    """Why the node cannot give its kernels cgroups here."""


@dataclass(frozen=True)
class KernelCgroup:
    """One kernel's cgroups (one directory under v2, one per controller under v1)."""

    version: int
    dirs: dict[str, Path]
    """Controller -> the kernel's directory in that controller's hierarchy."""

    def enter(self) -> list[str]:
        """The command prefix that runs a command inside these cgroups."""
        procs = sorted({str(d / "cgroup.procs") for d in self.dirs.values()})
        return ["sh", "-c", _ENTER, "actfleet-cgroup", *procs, "--"]

    def oom_killed(self) -> bool:
        """Whether the OOM killer has killed a process of this kernel for its limit."""
        memory = self.dirs.get("memory")
        if memory is None:
            return False
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value) > 0
        return False

    def remove(self) -> None:
        """Kill what is left in the cgroups, then remove them."""
        for directory in set(self.dirs.values()):
            _remove(directory)


@dataclass(frozen=True)
class NodeCgroups:
    """Where this node makes its kernels' cgroups."""

    version: int
    parents: dict[str, Path]
    """Controller -> the directory holding this node's kernel cgroups."""
    _names: itertools.count[int] = field(default_factory=itertools.count, compare=False)

    def describe(self) -> str:
        return f"cgroup v{self.version} ({', '.join(sorted(self.parents))})"

    def make(self, memory: int, procs: int) -> KernelCgroup:
        """A new kernel's cgroups with these limits (0: none)."""
        name = f"kernel-{next(self._names)}"
        dirs = {controller: parent / name for controller, parent in self.parents.items()}
        cgroup = KernelCgroup(self.version, dirs)
        try:
            for directory in set(dirs.values()):
                directory.mkdir()
            if "memory" in dirs and memory:
                if self.version == 2:
                    _write(dirs["memory"] / "memory.max", memory)
                    _write(dirs["memory"] / "memory.swap.max", 0, optional=True)
                    _write(dirs["memory"] / "memory.oom.group", 1, optional=True)
                else:
                    _write(dirs["memory"] / "memory.limit_in_bytes", memory)
                    _write(dirs["memory"] / "memory.memsw.limit_in_bytes", memory, optional=True)
            if "pids" in dirs and procs:
                _write(dirs["pids"] / "pids.max", procs)
        except OSError:
            cgroup.remove()
            raise
        return cgroup


@functools.cache
def node_cgroups(enabled: bool = True) -> NodeCgroups | None:
    """This node's kernel cgroups, found (and for v2 prepared) once per process; None, with
    the reason logged, where the node may not create them."""
    if not enabled:
        log.info("kernel limits: rlimits only (ACTFLEET_KERNEL_CGROUPS=false)")
        return None
    try:
        found = _v2() if (ROOT / "cgroup.controllers").exists() else _v1()
        _probe(found)
    except (CgroupsUnavailable, OSError, subprocess.SubprocessError) as exc:
        log.info("kernel limits: rlimits only; no cgroup per kernel (%s)", exc)
        return None
    log.info("kernel limits: %s per kernel, rlimits for the rest", found.describe())
    return found


def _v2() -> NodeCgroups:
    """Kernels' cgroups beside the node's: the node's cgroup (holding only the node and the
    processes it runs under, e.g. tini) is split into a leaf for them and one per node's
    kernels, because a cgroup that holds processes cannot enable controllers for children."""
    own = next(
        (line[3:] for line in _read(Path("/proc/self/cgroup")).splitlines() if line[:3] == "0::"),
        None,
    )
    if own is None:
        raise CgroupsUnavailable("this process is in no cgroup v2")
    base = ROOT / own.strip().lstrip("/")
    available = _read(base / "cgroup.controllers").split()
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        raise CgroupsUnavailable(f"{base} has no {' or '.join(missing)} controller (delegate them)")
    if not os.access(base, os.W_OK):
        raise CgroupsUnavailable(f"{base} is not writable by the node (delegate it)")
    enabled = _read(base / "cgroup.subtree_control").split()
    if any(c not in enabled for c in CONTROLLERS):
        mine = {os.getpid(), *_ancestors()}
        others = [p for p in map(int, _read(base / "cgroup.procs").split()) if p not in mine]
        if others:
            raise CgroupsUnavailable(
                f"{base} holds processes other than the node and its parents ({others[:5]}); "
                "run the node in a cgroup of its own (a container, a systemd service with "
                "Delegate=yes)"
            )
        leaf = base / "actfleet-node"
        leaf.mkdir(exist_ok=True)
        for pid in map(int, _read(base / "cgroup.procs").split()):
            with contextlib.suppress(ProcessLookupError):
                _write(leaf / "cgroup.procs", pid)
        _write(base / "cgroup.subtree_control", _ENABLE)
    parent = _node_dir(base)
    _write(parent / "cgroup.subtree_control", _ENABLE)
    return NodeCgroups(2, dict.fromkeys(CONTROLLERS, parent))


def _v1() -> NodeCgroups:
    """Kernels' cgroups under the node's own in each v1 hierarchy (memory, pids) mounted and
    writable here."""
    own: dict[str, str] = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(","):
            own[name] = path
    parents: dict[str, Path] = {}
    reasons = []
    for controller in CONTROLLERS:
        base = ROOT / controller / own.get(controller, "/").lstrip("/")
        if controller not in own or not (base / "cgroup.procs").exists():
            reasons.append(f"no cgroup v1 {controller} hierarchy at {ROOT / controller}")
        elif not os.access(base, os.W_OK):
            reasons.append(f"{base} is not writable by the node")
        else:
            parents[controller] = _node_dir(base)
    if not parents:
        raise CgroupsUnavailable("; ".join(reasons))
    return NodeCgroups(1, parents)


def _node_dir(base: Path) -> Path:
    """This node's directory for its kernels' cgroups under `base`; those of nodes that are
    gone (their pid is not running) are removed first."""
    for stale in base.glob("actfleet-kernels-*"):
        pid = stale.name.rsplit("-", 1)[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for child in stale.iterdir():
                if child.is_dir():
                    _remove(child)
            _remove(stale)
    directory = base / f"actfleet-kernels-{os.getpid()}"
    directory.mkdir(exist_ok=True)
    return directory


def _probe(found: NodeCgroups) -> None:
    """Start a process in a kernel cgroup the way a kernel is started: a node that can make
    the directories but not move a process in (an undelegated cgroup) finds out now."""
    cgroup = found.make(64 * 1024**2, 16)
    try:
        subprocess.run([*cgroup.enter(), "true"], check=True, capture_output=True, timeout=10)
    except subprocess.CalledProcessError as exc:
        reason = exc.stderr.decode(errors="replace").strip()
        raise CgroupsUnavailable(f"cannot move a process into {cgroup.dirs}: {reason}") from None
    finally:
        cgroup.remove()


def _remove(directory: Path) -> None:
    """Kill the processes in a cgroup directory and remove it (retrying while they exit)."""
    if (directory / "cgroup.kill").exists():
        with contextlib.suppress(OSError):
            _write(directory / "cgroup.kill", 1)
    deadline = time.monotonic() + 2
    while True:
        for pid in _read(directory / "cgroup.procs", missing="").split():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), signal.SIGKILL)
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                log.warning("cgroup %s not removed: %s", directory, exc)
                return
            time.sleep(0.02)


def _ancestors() -> list[int]:
    pids, pid = [], os.getppid()
    while pid > 1:
        pids.append(pid)
        stat = _read(Path(f"/proc/{pid}/stat"), missing="")
        pid = int(stat.rsplit(")", 1)[1].split()[1]) if stat else 0
    return pids


def _read(path: Path, missing: str | None = None) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        if missing is None:
            raise
        return missing


def _write(path: Path, value: object, optional: bool = False) -> None:
    """Write a cgroup file; an `optional` one may be missing or refused (e.g. no swap
    accounting)."""
    try:
        path.write_text(str(value))
    except OSError:
        if not optional:
            raise
