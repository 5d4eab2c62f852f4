"""The sandbox each kernel runs in: bubblewrap namespaces, an unprivileged uid, rlimits.

A kernel sees its own processes only (PID namespace), a mount view holding the system and
Python directories read-only, its own directory (IPC sockets, connection file) and its
workspace read-write, and a private `/tmp` and `/dev/shm`; other sessions' directories,
other kernels, the node's files and the node's environment are not there. With network
`none` it has a loopback of its own and nothing else. When the node runs as root the
kernel runs as a uid of its own (one per kernel, so per-uid limits are per kernel).
docs/security.md says what this does and does not guarantee.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from actfleet.broker.settings import Settings
from actfleet.workers.cgroups import KernelCgroup, NodeCgroups, node_cgroups

Network = Literal["none", "full"]
NETWORKS: tuple[Network, ...] = ("none", "full")
WORKSPACE = Path("/workspace")
"""Where a sandboxed kernel sees its working directory."""


def code_dir(working_dir: Path, sandboxed: bool) -> Path:
    """Where a kernel's code sees its working directory (what the model is told)."""
    return WORKSPACE if sandboxed else working_dir


_SYSTEM_DIRS = ("/usr", "/etc/alternatives", "/etc/ssl", "/etc/ca-certificates")
_SYSTEM_FILES = (
    "/etc/ld.so.cache",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/mime.types",
)
_UID_SLOTS = 4096
_REAPER = """\
import ctypes, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0):  # PR_SET_DUMPABLE
    sys.exit(f"actfleet: the sandbox's pid 1 stays readable: {os.strerror(ctypes.get_errno())}")
child = os.fork()
if child == 0:
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    except OSError as exc:
        print(f"actfleet: {sys.argv[1]}: {exc}", file=sys.stderr)
    os._exit(127)
while True:
    pid, status = os.wait()
    if pid == child:
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
"""
"""The sandbox's pid 1 when the node is not root, in place of bwrap's: it reaps like bwrap's
but is not dumpable. bwrap's runs as the kernel's uid there, so the kernel could read its
environment and memory through /proc/1; this one's are refused (ptrace rules)."""


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here; the message says what to do."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one kernel (0: none): rlimits, but for memory and processes where
    the kernel has cgroups (cgroups.py), which bound all its processes together."""

    memory: int
    """Bytes of memory of the kernel's cgroup, else of address space per process
    (RLIMIT_AS)."""
    procs: int
    """Processes of the kernel's cgroup, else of the kernel's uid (RLIMIT_NPROC)."""
    files: int
    """Open files (RLIMIT_NOFILE)."""
    file_size: int
    """Bytes a written file may reach (RLIMIT_FSIZE)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            memory=settings.kernel_memory,
            procs=settings.kernel_procs,
            files=settings.kernel_files,
            file_size=settings.kernel_file_size,
        )

    def prlimit(self, cgroup: KernelCgroup | None = None) -> list[str]:
        """The `prlimit` command prefix setting these limits (soft = hard), but those the
        kernel's cgroup bounds already (for all its processes together)."""
        controlled = cgroup.dirs if cgroup is not None else {}
        flags = {
            "--as": 0 if "memory" in controlled else self.memory,
            "--nproc": 0 if "pids" in controlled else self.procs,
            "--nofile": self.files,
            "--fsize": self.file_size,
        }
        return ["prlimit", *(f"{flag}={value}" for flag, value in flags.items() if value), "--"]


@dataclass(frozen=True)
class Sandbox:
    """How this node confines its kernels."""

    network: Network
    limits: Limits
    uid_base: int
    """First uid of the kernels' uids (used when the node runs as root)."""
    cgroups: NodeCgroups | None = None
    """Where kernels get cgroups of their own, if the node may make them (cgroups.py)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> Sandbox:
        if settings.kernel_network not in NETWORKS:
            raise SandboxUnavailable(
                f"ACTFLEET_KERNEL_NETWORK={settings.kernel_network!r}: use none or full"
            )
        limits = Limits.from_settings(settings)
        cgroups = node_cgroups(settings.kernel_cgroups)
        return cls(settings.kernel_network, limits, settings.kernel_uid_base, cgroups)

    def cgroup(self) -> KernelCgroup | None:
        """A new kernel's cgroups with this sandbox's limits, where the node makes them."""
        if self.cgroups is None:
            return None
        return self.cgroups.make(self.limits.memory, self.limits.procs)

    @classmethod
    def of(cls, settings: Settings) -> Sandbox | None:
        """The node's sandbox, or None when the settings turn it off (--no-sandbox)."""
        return cls.from_settings(settings) if settings.sandbox else None

    def command(
        self,
        kernel_dir: Path,
        workspace: Path,
        argv: list[str],
        uid: int | None,
        cgroup: KernelCgroup | None = None,
    ) -> list[str]:
        """bwrap's command line running `argv` confined, `workspace` seen as WORKSPACE and
        `kernel_dir` at its own path; as `uid` when given (the node is root); inside
        `cgroup` when given."""
        args = [*(cgroup.enter() if cgroup is not None else [])]
        args += ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--hostname", "kernel"]
        if self.network == "none":
            args.append("--unshare-net")
        reaper: list[str] = []
        if os.geteuid() != 0:
            args += ["--unshare-user", "--as-pid-1"]
            reaper = [sys.executable, "-I", "-S", "-c", _REAPER]
        # /tmp first: what is bound below it afterwards (a venv or a workdir in /tmp) shows.
        args += ["--perms", "1777", "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
        args += ["--perms", "1777", "--tmpfs", "/dev/shm"]
        made: set[Path] = {Path("/"), Path("/tmp"), Path("/dev")}
        for path in (*_SYSTEM_DIRS, *_SYSTEM_FILES):
            if os.path.exists(path):
                args += [*_parents(Path(path), made), "--ro-bind", path, path]
        for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
            if os.path.islink(link):
                args += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link):
                args += ["--ro-bind", link, link]
        for prefix in sorted({sys.prefix, sys.base_prefix, _real_prefix()}):
            args += [*_parents(Path(prefix), made), "--ro-bind", prefix, prefix]
        args += [*_parents(kernel_dir, made), "--bind", str(kernel_dir), str(kernel_dir)]
        args += ["--bind", str(workspace), str(WORKSPACE), "--chdir", str(WORKSPACE)]
        args += ["--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp"]
        # The node is not in the kernel's PID namespace: its pid there means nothing, and
        # --die-with-parent already ends the kernel with the node.
        args += ["--unsetenv", "JPY_PARENT_PID"]
        args += ["--", *reaper, *self.limits.prlimit(cgroup)]
        if uid is not None:
            args += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
            args += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        return [*args, *argv]


class UidSlot:
    """One kernel uid, held (by an flock on this machine) for the kernel's life, so two
    live kernels never share a uid, whichever node started them. A process still running
    as a free uid is a kernel that outlived its node (SIGKILLed while the kernel was being
    started): it is killed before the uid is used again."""

    def __init__(self, base: int, lock_dir: Path = Path("/run/actfleet-uids")) -> None:
        lock_dir.mkdir(parents=True, exist_ok=True)
        for slot in range(_UID_SLOTS):
            fd = os.open(lock_dir / str(slot), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = base + slot, fd
            _kill_processes_of(self.uid)
            return
        raise SandboxUnavailable(f"all {_UID_SLOTS} kernel uids from {base} are in use")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _kill_processes_of(uid: int) -> None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        uids = next((line.split()[1:] for line in status.splitlines() if line[:4] == "Uid:"), [])
        if str(uid) in uids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


def check_available(sandbox: Sandbox) -> None:
    """Raise SandboxUnavailable, saying why and what to do, unless bwrap can confine a
    process here the way kernels are confined."""
    for tool in ("bwrap", "prlimit", *(("setpriv",) if os.geteuid() == 0 else ())):
        if shutil.which(tool) is None:
            package = {"bwrap": "bubblewrap", "prlimit": "util-linux", "setpriv": "util-linux"}
            raise SandboxUnavailable(
                f"{tool} is not installed (Debian: apt-get install -y {package[tool]}); kernels "
                "run in a bubblewrap sandbox. Install it, or start the node with --no-sandbox "
                "to run kernels unconfined (docs/security.md)"
            )
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"actfleet-sandbox-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    # As root the probe runs as a kernel uid, held like a kernel's (a free uid's processes
    # are killed when another node takes it).
    slot = UidSlot(sandbox.uid_base) if os.geteuid() == 0 else None
    try:
        if slot is not None:
            os.chown(probe, slot.uid, slot.uid)
        uid = slot.uid if slot is not None else None
        cmd = sandbox.command(probe, probe, [sys.executable, "-c", "pass"], uid)
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    finally:
        shutil.rmtree(probe, ignore_errors=True)
        if slot is not None:
            slot.release()
    if result.returncode != 0:
        raise SandboxUnavailable(
            f"bubblewrap cannot create the kernels' namespaces here ({result.stderr.strip()}). "
            "In a container, allow it: Docker needs --security-opt seccomp=unconfined "
            "--security-opt apparmor=unconfined --security-opt systempaths=unconfined (or "
            "--privileged); Kubernetes needs seccomp and AppArmor Unconfined, procMount "
            "Unmasked and hostUsers: false (deploy/kubernetes/worker.yaml), or privileged. "
            "Or start the node with --no-sandbox to run "
            "kernels unconfined (docs/security.md)"
        )


def _parents(path: Path, made: set[Path]) -> list[str]:
    """Create `path`'s ancestors not `made` yet, 0755, in the sandbox (bwrap would make
    them 0700, which an unprivileged kernel could not pass through)."""
    args: list[str] = []
    for parent in reversed(path.parents):
        if parent not in made:
            made.add(parent)
            args += ["--perms", "0755", "--dir", str(parent)]
    return args


def _real_prefix() -> str:
    """The directory of the interpreter the venv's python links to."""
    return str(Path(os.path.realpath(sys.executable)).parent.parent)
