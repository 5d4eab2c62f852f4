"""One stateful IPython kernel: start, execute, interrupt, restart, shutdown.

ipykernel is driven through jupyter_client's async API, not ipybox's `CodeExecutor`, which
loses output and hangs when its kernel dies (DESIGN §7). A `Kernel` is the handle an agent's
runtime holds; behind it a `KernelProcess` is replaced whenever the kernel dies or has to be
restarted, and the init code (cwd restore, shell-approval hooks; shell_approvals.py) is
re-applied to every new process, which runs in the node's sandbox (sandbox.py) and plots
inline with matplotlib (plots.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from queue import Empty
from typing import Any, Literal

import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from actfleet.broker.settings import Settings
from actfleet.broker.settings import settings as current_settings
from actfleet.workers.mcp_codegen import tool_request
from actfleet.workers.plots import matplotlib_env
from actfleet.workers.sandbox import Sandbox, UidSlot, code_dir
from actfleet.workers.shell_approvals import APPROVED, REJECTED, init_code, shell_request

__all__ = (
    "CellImage",
    "CellResult",
    "CellStatus",
    "Kernel",
    "KernelClosedError",
    "KernelProcess",
    "KernelStartError",
    "Launcher",
    "OnOutput",
    "OnShell",
    "OnTool",
    "kernel_env",
)

logger = logging.getLogger(__name__)

CellStatus = Literal["ok", "error", "interrupted", "restarted", "died"]
OnOutput = Callable[[str], None]
"""Called with each piece of a cell's output as it arrives (until the output cap is reached)."""
OnShell = Callable[[str], Awaitable[bool]]
"""Decides a `!cmd` the cell wants to run: `True` runs it once, `False` makes it raise."""
OnTool = Callable[[dict[str, Any]], Awaitable[str]]
"""Makes a programmatic tool call the cell asks for (`server`, `tool`, `arguments`) and
returns the reply the cell's `mcptools.call` reads."""
Launcher = Callable[[], Awaitable["KernelProcess"]]
"""Where a `Kernel` gets a fresh process from, at start and on every restart."""

_POLL = 0.25
"""Seconds a silent wait lasts before checking that the kernel process is still alive."""
_MARKER_ROOM = 64
"""Bytes of the output cap set aside for the preview's omission marker."""
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
_SECRET_PREFIXES = ("ACTFLEET_", "OPENAI_", "ANTHROPIC_", "GOOGLE_", "GEMINI_")
_KERNEL_SPECS = KernelSpecManager(kernel_dirs=[])
"""Only the native spec: this interpreter's ipykernel, whatever kernelspecs are installed."""

_DIED = "Kernel died while executing; its state was lost. A fresh kernel is running."
_DIED_IDLE = (
    "Kernel had died since the previous cell; its state was lost. This cell ran in a fresh kernel."
)
_SHUT_DOWN = "Kernel was shut down while executing."

IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/svg+xml": "svg"}
"""Display data kept as images (the first of these a message has), with their extension."""
IMAGES_DIR = "images"
"""Where a cell's images are saved, in the agent's working directory."""
MAX_IMAGES = 16
"""Images kept per cell; more are dropped with a note."""
MAX_IMAGE_BYTES = 8 * 1024**2
"""Bytes an image may have; a larger one is dropped with a note."""
_MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}


class KernelStartError(RuntimeError):
    """A kernel process did not come up, or its init code failed."""


class KernelClosedError(RuntimeError):
    """The kernel (or pool) was shut down."""


@dataclass(frozen=True)
class CellImage:
    """An image a cell displayed, saved in the agent's working directory."""

    path: str
    """Relative to the working directory: `images/<sha256>.<ext>`."""
    media_type: str
    data: bytes

    @property
    def name(self) -> str:
        """`<sha256>.<ext>`: the image's file name, and its name in Redis."""
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class CellResult:
    """What one cell did; `text` is what the model sees."""

    status: CellStatus
    text: str
    """The output with any status note, or a head...tail preview of it over the output cap."""
    full_text: str | None
    """The complete output when `text` is a preview (for the caller to store), else `None`."""
    truncated: bool
    images: tuple[CellImage, ...]
    """Images the cell displayed (PNG, JPEG, SVG), saved under the working directory's
    `images/`; `text` ends with their paths as the kernel sees them."""
    duration: float
    """Wall-clock seconds, approval waits included."""


def kernel_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment minus anything that may be a secret, plus `extra`."""
    env = {name: value for name, value in os.environ.items() if not _is_secret(name)}
    env.update(extra or {})
    for name in ("no_proxy", "NO_PROXY"):  # approval requests go to 127.0.0.1, never a proxy
        env[name] = ",".join(filter(None, (env.get(name), "127.0.0.1")))
    return env


def _chown_tree(path: Path, uid: int) -> None:
    """Give a working directory and everything in it to a kernel's uid."""
    os.chown(path, uid, uid, follow_symlinks=False)
    for parent, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chown(os.path.join(parent, name), uid, uid, follow_symlinks=False)


def _is_secret(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(_SECRET_PREFIXES) or any(word in upper for word in _SECRET_WORDS)


_IPC_PATH_MAX = 100
"""Characters of a socket path (the kernel's is its directory plus `ipc-N`): below the
107 of sockaddr_un."""


class _Manager(AsyncKernelManager):
    """jupyter_client's manager, starting the kernel under a command prefix (the sandbox)."""

    prefix: list[str] = []

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        # No SQLite history (In/Out stay in memory): a birth costs ~8% less CPU, and the
        # kernel writes no history database.
        command = super().format_kernel_cmd(extra_arguments)
        return [*self.prefix, *command, "--HistoryManager.enabled=False"]


class _Client(AsyncKernelClient):
    """jupyter_client's client, its stdin socket sending only over a completed connection
    (ZMQ_IMMEDIATE), so that `_handshake` can tell when the kernel can reach it: the
    kernel's ROUTER drops an input request to a client it does not know yet, and the cell
    asking would wait for its approval until its timeout."""

    def _create_connected_socket(self, channel: str, identity: bytes | None = None) -> Any:
        if channel != "stdin":
            return super()._create_connected_socket(channel, identity)
        sock = self.context.socket(zmq.DEALER)
        sock.linger = 1000
        sock.immediate = True
        if identity:
            sock.identity = identity
        sock.connect(self._make_url(channel))
        return sock


class KernelProcess:
    """One ipykernel process, its IPC sockets and connection file in a private directory,
    confined by `sandbox` when given. A sandboxed process has an empty workspace of its own
    (`adopt` makes it an agent's working directory)."""

    def __init__(self, directory: Path, workspace: Path | None, sandbox: Sandbox | None) -> None:
        self.directory = directory
        self.workspace = workspace
        self._adopted = False
        self.cgroup = sandbox.cgroup() if sandbox and workspace is not None else None
        """The kernel's cgroups, where the node makes them (cgroups.py)."""
        try:
            self._uid = UidSlot(sandbox.uid_base) if sandbox and os.geteuid() == 0 else None
        except BaseException:
            if self.cgroup is not None:
                self.cgroup.remove()
            raise
        self.manager = _Manager(
            transport="ipc",
            ip=str(directory / "ipc"),
            connection_file=str(directory / "connection.json"),
            kernel_spec_manager=_KERNEL_SPECS,
            context=zmq.asyncio.Context.instance(),
            client_factory=_Client,
        )
        self.manager.write_connection_file()  # so the client knows the sockets before launch
        if sandbox is not None and workspace is not None:
            uid = self._uid.uid if self._uid else None
            self.manager.prefix = sandbox.command(directory, workspace, [], uid, self.cgroup)
            # A SIGINT to the process group would reach bubblewrap too and end the kernel;
            # an interrupt_request on the control channel interrupts the kernel alone.
            self.manager.kernel_spec.interrupt_mode = "message"
            if uid is not None:
                for path in (directory, workspace, directory / "connection.json"):
                    os.chown(path, uid, uid)
        self.client: AsyncKernelClient = self.manager.client(context=self.manager.context)

    @classmethod
    async def launch(
        cls,
        env: Mapping[str, str],
        *,
        timeout: float,
        sandbox: Sandbox | None = None,
        root: Path | None = None,
    ) -> KernelProcess:
        """Start a kernel and wait until it answers; kill it if that takes over `timeout` s.
        Its sockets go in the temp dir (a socket's path is short); a sandboxed kernel's
        workspace goes in `root` (default the temp dir), on the working directories'
        filesystem so that `adopt` can rename it."""
        directory = Path(os.path.realpath(tempfile.mkdtemp(prefix="actfleet-k-")))
        if len(str(directory / "ipc-1")) > _IPC_PATH_MAX:
            shutil.rmtree(directory)
            raise KernelStartError(
                f"the kernel's socket path under {directory.parent} is longer than "
                f"{_IPC_PATH_MAX} characters; set TMPDIR to a shorter directory"
            )
        workspace = None
        if sandbox is not None:
            root = root or Path(tempfile.gettempdir())
            root.mkdir(parents=True, exist_ok=True)
            workspace = Path(os.path.realpath(tempfile.mkdtemp(prefix="work-", dir=root)))
        process = cls(directory, workspace, sandbox)
        try:
            uid = process._uid.uid if process._uid else None
            # Before the start timeout: a node's first kernel builds the font list.
            plots = await asyncio.to_thread(matplotlib_env, directory, uid)
            async with asyncio.timeout(timeout):
                await process.manager.start_kernel(env={**env, **plots}, cwd=str(process.directory))
                # No heartbeat channel: it runs a thread; liveness is polled from the process.
                process.client.start_channels(stdin=True, hb=False, control=False)
                await process._handshake()
        except TimeoutError:
            await process.close()
            raise KernelStartError(f"kernel did not start within {timeout:g} s") from None
        except BaseException:
            await process.close()
            raise
        return process

    def adopt(self, working_dir: Path) -> None:
        """Make this process's workspace the agent's working directory: what the directory
        holds moves in (a restarted or moved agent keeps its files), then the workspace
        takes its place. Only a sandboxed process needs this: its mount names the
        workspace's inode, which a rename keeps."""
        if self.workspace is None:
            return
        try:
            if working_dir.exists():
                for entry in working_dir.iterdir():
                    entry.rename(self.workspace / entry.name)
                working_dir.rmdir()
            working_dir.parent.mkdir(parents=True, exist_ok=True)
            self.workspace.rename(working_dir)
        except OSError as exc:
            raise KernelStartError(
                f"cannot move {working_dir} into the kernel's workspace ({exc}); kernels' "
                "directories and working directories must be on one filesystem"
            ) from exc
        self.workspace, self._adopted = working_dir, True
        if self._uid is not None:
            _chown_tree(working_dir, self._uid.uid)

    async def alive(self) -> bool:
        return await self.manager.is_alive()

    async def interrupt(self) -> None:
        """SIGINT to the kernel's process group: the running cell gets KeyboardInterrupt."""
        if await self.alive():
            await self.manager.interrupt_kernel()

    async def kill(self) -> None:
        """SIGKILL the kernel's process group and wait for it; the client stays open."""
        await self.manager.shutdown_kernel(now=True)

    async def close(self) -> None:
        await self.kill()
        self.client.stop_channels()
        shutil.rmtree(self.directory, ignore_errors=True)
        if self.workspace is not None and not self._adopted:
            shutil.rmtree(self.workspace, ignore_errors=True)
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.remove)
        if self._uid is not None:
            self._uid.release()

    async def _handshake(self) -> None:
        """Wait for a kernel_info reply on shell, a first message on iopub (subscribed) and
        a completed stdin connection (see `_Client`)."""
        while True:
            self.client.kernel_info()
            try:
                # Any kernel_info reply will do: under load it may answer an earlier request.
                reply = await self.client.get_shell_msg(timeout=1)
                if reply["msg_type"] == "kernel_info_reply":
                    await self.client.get_iopub_msg(timeout=0.5)
                    break
            except Empty:
                if not await self.alive():
                    raise KernelStartError("kernel process exited during start-up") from None
        # A message on stdin goes out only once the connection is complete; the kernel
        # drops it (it purges stdin before each input request).
        socket = self.client.stdin_channel.socket
        while True:
            try:
                await socket.send(b"actfleet: stdin connected", flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                if not await self.alive():
                    raise KernelStartError("kernel process exited during start-up") from None
                await asyncio.sleep(0.005)


class Kernel:
    """An agent's stateful kernel; it outlives its process dying or being restarted."""

    def __init__(self, working_dir: Path, launcher: Launcher, settings: Settings) -> None:
        self.working_dir = working_dir
        self.code_dir = working_dir
        """Where the kernel's code sees `working_dir` (`/workspace` in a sandbox)."""
        self._launcher = launcher
        self._settings = settings
        self._process: KernelProcess | None = None
        self._replacing: asyncio.Task[None] | None = None
        self._cell: _Cell | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def start(
        cls,
        working_dir: Path | str,
        *,
        settings: Settings | None = None,
        env: Mapping[str, str] | None = None,
        launcher: Launcher | None = None,
    ) -> Kernel:
        """A kernel working in `working_dir` (created if missing), its init code applied.

        Processes come from `launcher` (e.g. a `KernelPool`), else are launched here with
        `kernel_env(env)`.
        """
        settings = settings or current_settings()
        working_dir = Path(working_dir).resolve()
        if launcher is None:
            launcher = partial(
                KernelProcess.launch,
                kernel_env(env),
                timeout=settings.kernel_start_timeout,
                sandbox=Sandbox.of(settings),
                root=working_dir.parent / ".kernels",
            )
        elif env is not None:
            raise ValueError("pass env to the launcher, not beside it")
        working_dir.mkdir(parents=True, exist_ok=True)
        kernel = cls(working_dir, launcher, settings)
        try:
            await kernel._replace_process()
        except BaseException:
            await kernel.shutdown()
            raise
        return kernel

    @property
    def closed(self) -> bool:
        return self._closed

    async def execute(
        self,
        code: str,
        *,
        timeout: float | None = None,
        on_output: OnOutput | None = None,
        on_shell: OnShell | None = None,
        on_tool: OnTool | None = None,
    ) -> CellResult:
        """Run one cell until the kernel reports idle for it, it times out, or it dies.

        `timeout` (default: settings' `execution_timeout`) excludes time spent awaiting
        `on_shell` and `on_tool`; without `on_shell` shell commands are approved, without
        `on_tool` tool calls fail.
        """
        timeout = self._settings.execution_timeout if timeout is None else timeout
        async with self._lock:
            started = time.monotonic()
            process, lost = await self._live_process()
            out = _Output(self._settings.output_cap, on_output)
            if lost:
                out.note(_DIED_IDLE)
            self._cell = cell = _Cell(on_shell, on_tool)
            # stop_on_error=False: an abandoned erroring cell must not abort the next one.
            msg_id = process.client.execute(code, allow_stdin=True, stop_on_error=False)
            stdin = asyncio.create_task(self._serve_stdin(process, out))
            finished = False
            try:
                status = await self._run(process, msg_id, out, cell.clock, timeout)
                finished = True
            finally:
                self._cell = None
                stdin.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stdin
                if not finished:  # cancelled, or on_output raised: don't leave the cell running
                    await process.interrupt()
            images = _save_images(self.working_dir, out)
            text = out.text()
            preview, truncated = _preview(text, self._settings.output_cap)
            links = "".join(f"![image]({self.code_dir / image.path})\n" for image in images)
            if links and preview and not preview.endswith("\n"):
                links = "\n" + links
            return CellResult(
                status=status,
                text=preview + links,
                full_text=text if truncated else None,
                truncated=truncated,
                images=images,
                duration=time.monotonic() - started,
            )

    async def restart(self) -> None:
        """A fresh process in place of the current one, init applied (the model's
        reset_kernel): the kernel's state is gone, its working directory stays."""
        async with self._lock:
            self._check_open()
            await self._settle_replacement()
            await self._replace_process()

    async def interrupt(self) -> None:
        """Interrupt the running cell, if any (SIGINT to the kernel's process group)."""
        if self._process is not None:
            await self._process.interrupt()

    async def shutdown(self) -> None:
        """Kill the kernel and its approval server; a running cell returns as died."""
        if self._closed:
            return
        self._closed = True
        if self._replacing is not None:
            self._replacing.cancel()
        if self._process is not None:
            await self._process.kill()
        async with self._lock:  # a running cell notices the death within _POLL and returns
            await self._settle_replacement()
            if self._process is not None:
                await self._process.close()
                self._process = None

    async def _run(
        self, process: KernelProcess, msg_id: str, out: _Output, clock: _Clock, timeout: float
    ) -> CellStatus:
        """Collect a started cell's output and settle how it ended."""
        state = await _until_idle(process, msg_id, out, lambda: timeout - clock.elapsed())
        if state == "late":
            await process.interrupt()
            grace_end = time.monotonic() + self._settings.interrupt_grace
            state = await _until_idle(process, msg_id, out, lambda: grace_end - time.monotonic())
            if state == "idle":
                await _reply(process, msg_id)
                out.note(
                    f"Execution exceeded the {timeout:g} s timeout and was interrupted; "
                    "the kernel kept its state."
                )
                return "interrupted"
            if state == "late":
                await process.kill()
                self._replace_in_background()
                out.note(
                    f"Execution exceeded the {timeout:g} s timeout and did not stop when "
                    "interrupted; the kernel was restarted and its state was lost."
                )
                return "restarted"
        if state == "idle" and (reply := await _reply(process, msg_id)) is not None:
            if out.error_name == "MemoryError" and (limit := self._memory_limit()):
                out.note(f"The kernel's memory is limited to {limit}.")
            return "error" if out.error or reply["content"]["status"] != "ok" else "ok"
        if self._closed:
            out.note(_SHUT_DOWN)
        else:
            limit = self._memory_limit()
            if limit and process.cgroup is not None and process.cgroup.oom_killed():
                out.note(f"{_DIED} It was killed for going over its memory limit, {limit}.")
            else:
                out.note(_DIED + (f" (Its memory is limited to {limit}.)" if limit else ""))
            self._replace_in_background()
        return "died"

    def _memory_limit(self) -> str:
        """The kernel's memory limit and the setting that makes it, if it has one."""
        memory = self._settings.kernel_memory
        if not self._settings.sandbox or not memory:
            return ""
        return f"{memory / 1024**2:,.0f} MiB (ACTFLEET_KERNEL_MEMORY={memory})"

    async def _live_process(self) -> tuple[KernelProcess, bool]:
        """The process to run the next cell on; `True` if the previous one died while idle."""
        self._check_open()
        await self._settle_replacement(raise_failure=True)
        lost = self._process is not None and not await self._process.alive()
        if self._process is None or lost:
            await self._replace_process()
        assert self._process is not None
        return self._process, lost

    async def _replace_process(self) -> None:
        """Close the current process, if any, and bring up a fresh one with init applied."""
        old, self._process = self._process, None
        if old is not None:
            await old.close()
        process = await self._launcher()
        try:
            process.adopt(self.working_dir)
            self.code_dir = code_dir(self.working_dir, process.workspace is not None)
            out = _Output(self._settings.output_cap, None)
            msg_id = process.client.execute(
                init_code(self.code_dir), store_history=False, allow_stdin=False
            )
            limit = time.monotonic() + self._settings.kernel_start_timeout
            state = await _until_idle(process, msg_id, out, lambda: limit - time.monotonic())
            if state != "idle" or out.error:
                raise KernelStartError(f"kernel init code did not run ({state}):\n{out.text()}")
            await _reply(process, msg_id)
        except BaseException:
            await process.close()
            raise
        self._process = process

    def _replace_in_background(self) -> None:
        if not self._closed:
            self._replacing = asyncio.create_task(self._replace_process())

    async def _settle_replacement(self, *, raise_failure: bool = False) -> None:
        """Wait for a background replacement; its failure leaves no process (and may raise)."""
        task, self._replacing = self._replacing, None
        if task is None:
            return
        try:
            await task
        except Exception:
            if raise_failure:
                raise
            logger.warning("kernel restart failed", exc_info=True)
        except asyncio.CancelledError:
            if not task.cancelled():  # we were cancelled, not the task
                raise

    def _check_open(self) -> None:
        if self._closed:
            raise KernelClosedError("kernel was shut down")

    async def _serve_stdin(self, process: KernelProcess, out: _Output) -> None:
        """Answer the running cell's stdin requests: a shell hook's approval request is
        decided; a plain `input()` gets an empty line and a note (nobody types here)."""
        while True:
            try:  # polls, so a cancel never lands while a message is being received
                msg = await process.client.get_stdin_msg(timeout=_POLL)
            except Empty:
                continue
            content = msg.get("content") if msg.get("msg_type") == "input_request" else None
            if not isinstance(content, dict):
                continue  # not a request (the kernel's messages are untrusted)
            prompt = str(content.get("prompt", ""))
            if (request := tool_request(prompt)) is not None:
                process.client.input(await self._call_tool(request))
                continue
            cmd = shell_request(prompt)
            if cmd is None:
                out.note("input() is not supported: nobody types into this kernel; it got ''")
                process.client.input("")
            else:
                process.client.input(APPROVED if await self._decide(cmd) else REJECTED)

    async def _decide(self, cmd: str) -> bool:
        """Approval of a `!cmd` from this kernel: asks the running cell's `on_shell`."""
        cell = self._cell
        if cell is None:
            logger.warning("shell command %r requested outside a cell; rejected", cmd)
            return False
        if cell.on_shell is None:
            return True
        with cell.clock.paused():
            return await cell.on_shell(cmd)

    async def _call_tool(self, request: dict[str, Any]) -> str:
        """A programmatic tool call from this kernel, made by the running cell's `on_tool`;
        its approval wait and the call do not count against the cell's timeout."""
        cell = self._cell
        if cell is None or cell.on_tool is None:
            return '{"error": "no MCP tools are available to this cell"}'
        with cell.clock.paused():
            return await cell.on_tool(request)


async def _until_idle(
    process: KernelProcess, msg_id: str, out: _Output, remaining: Callable[[], float]
) -> Literal["idle", "late", "dead"]:
    """Collect the cell's iopub output until the kernel reports idle for it (or dies, or
    `remaining()` seconds run out)."""
    while (left := remaining()) > 0:
        try:
            msg = await process.client.get_iopub_msg(timeout=min(left, _POLL))
        except Empty:
            if not await process.alive():
                return "dead"
            continue
        if msg["parent_header"].get("msg_id") == msg_id and out.take(msg):
            return "idle"
    return "late"


async def _reply(process: KernelProcess, msg_id: str) -> dict[str, Any] | None:
    """The cell's shell reply, or `None` if the kernel died first."""
    while True:
        try:
            msg = await process.client.get_shell_msg(timeout=_POLL)
        except Empty:
            if not await process.alive():
                return None
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


class _Output:
    """A cell's output, kept in full; pieces go to `on_output` until the cap is reached."""

    def __init__(self, cap: int, on_output: OnOutput | None) -> None:
        self._cap = cap
        self._on_output = on_output
        self._parts: list[str] = []
        self._streamed = 0
        self.images: list[tuple[str, bytes]] = []
        self.dropped: list[str] = []
        """Why images the cell displayed were not kept (one line each)."""
        self.error = False
        self.error_name = ""

    def take(self, msg: dict[str, Any]) -> bool:
        """Record one iopub message of the cell; `True` when it says the kernel is idle."""
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status":
            return content["execution_state"] == "idle"
        if kind == "stream":
            self.write(content["text"])
        elif kind in ("execute_result", "display_data", "update_display_data"):
            data = content.get("data")
            data = data if isinstance(data, dict) else {}
            media_type = next((t for t in IMAGE_TYPES if t in data), None)
            if media_type is not None:
                self.image(media_type, data[media_type])
            elif isinstance(text := data.get("text/plain"), str) and text:
                self.write(text + "\n")
        elif kind == "error":
            self.error, self.error_name = True, str(content.get("ename", ""))
            self.write(_ANSI.sub("", "\n".join(content["traceback"])) + "\n")
        return False

    def image(self, media_type: str, raw: Any) -> None:
        """Keep one displayed image (data from the kernel: checked, capped)."""
        if len(self.images) >= MAX_IMAGES:
            self.dropped.append(f"{media_type}: over the {MAX_IMAGES} images a cell may keep")
            return
        try:
            self.images.append((media_type, _image_bytes(media_type, raw)))
        except ValueError as exc:
            self.dropped.append(f"{media_type}: {exc}")

    def write(self, text: str) -> None:
        self._parts.append(text)
        if self._on_output is None or self._streamed >= self._cap:
            return
        data = text.encode()
        room = self._cap - self._streamed
        self._streamed += len(data)
        self._on_output(text if len(data) <= room else data[:room].decode(errors="ignore"))

    def note(self, text: str) -> None:
        """A status line of ours, on a line of its own."""
        at_line_start = not self._parts or self._parts[-1].endswith("\n")
        self.write(("" if at_line_start else "\n") + f"[{text}]\n")

    def text(self) -> str:
        return "".join(self._parts)


def _image_bytes(media_type: str, raw: Any) -> bytes:
    """The bytes of a displayed image: base64 checked for PNG and JPEG (and their magic
    bytes), UTF-8 text for SVG; ValueError saying what is wrong."""
    if not isinstance(raw, str):
        raise ValueError(f"not a string but {type(raw).__name__}")
    limit = MAX_IMAGE_BYTES if media_type == "image/svg+xml" else MAX_IMAGE_BYTES * 4 // 3 + 4096
    if len(raw) > limit:
        raise ValueError(f"larger than {MAX_IMAGE_BYTES} bytes")
    if media_type == "image/svg+xml":
        if "<svg" not in raw:
            raise ValueError("no <svg> element")
        return raw.encode()
    try:
        data = base64.b64decode("".join(raw.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not valid base64") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"larger than {MAX_IMAGE_BYTES} bytes")
    if not data.startswith(_MAGIC[media_type]):
        raise ValueError(f"not a {IMAGE_TYPES[media_type].upper()} image")
    return data


def _save_images(working_dir: Path, out: _Output) -> tuple[CellImage, ...]:
    """Save the cell's images as `images/<sha256>.<ext>` in the working directory, owned like
    it. The kernel owns that directory, so nothing in it is trusted: an `images` that is not
    a directory (a symlink) is not followed, and each file is written under a fresh name,
    then renamed over whatever had its name. What is not kept is noted in the output."""
    saved: list[CellImage] = []
    if out.images:
        try:
            saved = _write_images(working_dir, out.images)
        except OSError as exc:
            out.dropped.append(f"not saved: {IMAGES_DIR}/ in the working directory ({exc})")
    for reason in out.dropped:
        out.note(f"An image was not kept ({reason}).")
    return tuple(saved)


def _write_images(working_dir: Path, images: list[tuple[str, bytes]]) -> list[CellImage]:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    top = os.open(working_dir, flags)
    try:
        owner = os.fstat(top)
        with contextlib.suppress(FileExistsError):
            os.mkdir(IMAGES_DIR, 0o755, dir_fd=top)
        folder = os.open(IMAGES_DIR, flags, dir_fd=top)
    finally:
        os.close(top)
    try:
        if os.geteuid() == 0:
            os.fchown(folder, owner.st_uid, owner.st_gid)
        saved = []
        for media_type, data in images:
            name = f"{hashlib.sha256(data).hexdigest()}.{IMAGE_TYPES[media_type]}"
            temp = f".{name}.{os.getpid()}.tmp"
            create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            with open(os.open(temp, create, 0o644, dir_fd=folder), "wb") as file:
                file.write(data)
                if os.geteuid() == 0:
                    os.fchown(file.fileno(), owner.st_uid, owner.st_gid)
            os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
            saved.append(CellImage(f"{IMAGES_DIR}/{name}", media_type, data))
        return saved
    finally:
        os.close(folder)


def _preview(text: str, cap: int) -> tuple[str, bool]:
    """`text` if it fits in `cap` bytes, else its head and tail around an omission marker."""
    data = text.encode()
    if len(data) <= cap:
        return text, False
    half = max(cap - _MARKER_ROOM, 0) // 2
    head = data[:half].decode(errors="ignore")
    tail = data[len(data) - half :].decode(errors="ignore")
    omitted = len(data) - 2 * half
    return f"{head}\n[... {omitted} bytes of output omitted ...]\n{tail}", True


class _Clock:
    """Seconds since the cell started, not counting time spent paused (approval waits)."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._paused_total = 0.0
        self._paused_since = 0.0
        self._pauses = 0

    def elapsed(self) -> float:
        now = time.monotonic()
        paused = self._paused_total + (now - self._paused_since if self._pauses else 0.0)
        return now - self._start - paused

    @contextmanager
    def paused(self) -> Iterator[None]:
        if not self._pauses:
            self._paused_since = time.monotonic()
        self._pauses += 1
        try:
            yield
        finally:
            self._pauses -= 1
            if not self._pauses:
                self._paused_total += time.monotonic() - self._paused_since


@dataclass
class _Cell:
    """The cell a kernel is running: who decides its shell commands, who makes its tool
    calls, and its timeout clock."""

    on_shell: OnShell | None
    on_tool: OnTool | None = None
    clock: _Clock = field(default_factory=_Clock)
