"""Probes run from inside kernels, as a hostile cell would: other sessions, the node, Redis,
the node's secrets and the machine's resources are out of a sandboxed kernel's reach."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import actfleet
from actfleet.broker import events as ev
from actfleet.broker.settings import Settings
from actfleet.client import Client
from actfleet.client.local_redis import private_redis
from actfleet.workers.kernel import CellResult, Kernel
from tests.conftest import ACTFLEET, Fleet, _next_db, cli, wait_for, write_replay

SECRET = "sk-test-0123456789-do-not-leak"

PROBE = """
import glob, json, os
found = {}
def probe(name, action):
    try:
        found[name] = ["ok", repr(action())[:300]]
    except Exception as exc:
        found[name] = ["refused", type(exc).__name__]
def proc_view():  # the kernel's environment and every /proc environ and cmdline it reads
    seen = [repr(dict(os.environ))]
    for path in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline"):
        try:
            seen.append(open(path, "rb").read().decode(errors="replace"))
        except OSError:
            pass
    return seen
"""


def probe_cell(body: str) -> dict:
    return {"code": PROBE + textwrap.dedent(body) + "\nprint('PROBES', json.dumps(found))"}


def run_probes(client: Client, tmp_path: Path, body: str, **submit) -> dict:
    """Run a probe cell in a new session; what each probe did, by name."""
    replay = write_replay(tmp_path / f"r{len(list(tmp_path.iterdir()))}.jsonl", probe_cell(body))
    handle = client.submit("probe", model=f"replay:{replay}", approval="auto", **submit)
    client.wait(handle, timeout=120)
    return probes_of(client, handle.session_id)


def probes_of(client: Client, session_id: str) -> dict:
    for event in client.events(session_id, follow=False):
        if isinstance(event, ev.CodeExecutionOutput):
            output = client.output(event.output_ref) if event.truncated else event.text
            line = next((x for x in output.splitlines() if x.startswith("PROBES ")), None)
            assert line is not None, f"the probe cell printed no PROBES line: {output}"
            return json.loads(line.removeprefix("PROBES "))
    raise AssertionError(f"session {session_id} ran no cell")


def refused(found: dict, *names: str) -> bool:
    return all(found[name][0] == "refused" for name in names)


def kernel_pids(fleet: Fleet) -> list[int]:
    """Host pids of the fleet's kernel processes (descendants of its nodes)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, IndexError, ValueError):
                continue
    nodes = {proc.pid for proc in fleet.nodes.values()}

    def under_a_node(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid in nodes:
                return True
        return False

    pids = []
    for pid in parents:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"ipykernel_launcher" in cmdline and b"bwrap" not in cmdline and under_a_node(pid):
            pids.append(pid)
    return pids


@pytest.fixture(scope="module")
def fleet(redis_server: str, tmp_path_factory: pytest.TempPathFactory):
    """One node as an operator runs it: Redis with a password, a provider key in its
    environment, limits small enough to reach."""
    fleet = Fleet(
        f"{redis_server}/{next(_next_db)}",
        tmp_path_factory.mktemp("fleet"),
        {
            "OPENAI_API_KEY": SECRET,
            "ACTFLEET_KERNEL_MEMORY": str(1024**3),
            "ACTFLEET_KERNEL_PROCS": "64",
            "ACTFLEET_WARM_KERNELS": "2",
        },
    )
    try:
        fleet.start("n1")
        yield fleet
    finally:
        fleet.stop()


def test_a_kernel_cannot_reach_another_sessions_files_kernel_or_the_node(fleet, tmp_path: Path):
    client = Client(fleet.redis_url)
    writes_notes = write_replay(tmp_path / "b.jsonl", {"code": "open('notes', 'w').write('b')"})
    other = client.submit("b", model=f"replay:{writes_notes}", approval="auto")
    client.wait(other, timeout=120)
    notes = fleet.agent_file(other.session_id, "notes")
    assert notes.read_text() == "b"
    node_pid = fleet.nodes["n1"].pid
    kernels = kernel_pids(fleet)
    assert kernels, "the fleet's kernels were not found"
    found = run_probes(
        client,
        tmp_path,
        f"""
        import glob, signal
        probe("list", lambda: os.listdir({str(notes.parent)!r}))
        probe("read", lambda: open({str(notes)!r}).read())
        probe("write", lambda: open({str(notes.parent / "planted")!r}, "w").write("a"))
        probe("node dir", lambda: os.listdir({str(notes.parent.parent.parent)!r}))
        probe("kill node", lambda: os.kill({node_pid}, signal.SIGKILL))
        for pid in {kernels}:
            probe(f"kill kernel {{pid}}", lambda: os.kill(pid, signal.SIGKILL))
        found["connection files"] = glob.glob("/tmp/*/connection.json") + glob.glob(
            {str(fleet.workdir) + "/**/connection.json"!r}, recursive=True)
        found["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        """,
    )
    assert refused(found, "list", "read", "write", "node dir", "kill node")
    assert refused(found, *(f"kill kernel {pid}" for pid in kernels))
    assert len(found["connection files"]) == 1, found["connection files"]  # its own
    assert all(pid < 10 for pid in found["processes"])
    assert not (notes.parent / "planted").exists()
    assert fleet.nodes["n1"].poll() is None
    assert kernel_pids(fleet)


def test_no_secret_or_redis_credential_is_in_a_kernels_view(fleet, tmp_path: Path):
    password = urlsplit(fleet.redis_url).password
    assert password
    port = urlsplit(fleet.redis_url).port
    found = run_probes(
        Client(fleet.redis_url),
        tmp_path,
        f"""
        import socket
        probe("node environ", lambda: open("/proc/{fleet.nodes["n1"].pid}/environ").read())
        probe("init environ", lambda: open("/proc/1/environ", "rb").read())
        seen = proc_view()
        files = glob.glob("/tmp/**", recursive=True) + glob.glob("/workspace/**", recursive=True)
        for path in files:
            try:
                seen.append(open(path, errors="replace").read())
            except OSError:
                pass
        found["view"] = "\\n".join(seen)
        def redis_ping():
            with socket.create_connection(("127.0.0.1", {port}), timeout=5) as s:
                s.sendall(b"PING\\r\\n")
                return s.recv(100).decode()
        probe("redis", redis_ping)
        """,
    )
    assert refused(found, "node environ", "init environ")
    assert SECRET not in found["view"] and password not in found["view"]
    assert "NOAUTH" in found["redis"][1]


def test_network_none_cuts_a_session_off_redis_and_every_host_port(fleet, tmp_path: Path):
    port = urlsplit(fleet.redis_url).port
    body = f"""
        import socket
        probe("redis", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=5).close())
        """
    client = Client(fleet.redis_url)
    assert not refused(run_probes(client, tmp_path, body), "redis")  # the node's: full
    assert refused(run_probes(client, tmp_path, body, network="none"), "redis")


def test_a_session_keeps_the_network_its_first_turn_gave_it(fleet, tmp_path: Path):
    client = Client(fleet.redis_url)
    replay = write_replay(tmp_path / "r.jsonl", {"text": "hi"})
    handle = client.submit("hi", model=f"replay:{replay}", approval="auto")
    client.wait(handle, timeout=60)
    with pytest.raises(ValueError, match="start a new session"):
        client.submit("x", model=f"replay:{replay}", session_id=handle.session_id, network="none")
    with pytest.raises(ValueError, match="only narrow"):
        client.submit("x", model=f"replay:{replay}", network="full")
    proc = cli(fleet.redis_url, "submit", "x", "--model", f"replay:{replay}", "--network", "on")
    assert proc.returncode != 0 and "only narrow" in proc.stderr


def test_a_kernel_over_its_memory_limit_is_reported_died_with_the_limit_named(
    fleet, tmp_path: Path
):
    """With a cgroup per kernel (this machine's node may make them), the OOM killer ends a
    kernel that passes ACTFLEET_KERNEL_MEMORY; the model is told so, the node and the next
    cell go on."""
    assert "kernel limits: cgroup v" in (fleet.workdir / "n1.log").read_text()
    client = Client(fleet.redis_url)
    grow = "blocks = [bytearray(128 * 1024**2) for _ in range(16)]"
    replay = write_replay(tmp_path / "r.jsonl", {"code": grow}, {"code": "print('after')"})
    handle = client.submit("grow", model=f"replay:{replay}", approval="auto")
    client.wait(handle, timeout=120)
    outputs = [
        e
        for e in client.events(handle.session_id, follow=False)
        if isinstance(e, ev.CodeExecutionOutput)
    ]
    assert outputs[0].status == "died"
    assert "killed for going over its memory limit" in outputs[0].text
    assert "ACTFLEET_KERNEL_MEMORY=1073741824" in outputs[0].text
    assert outputs[1].status == "ok" and "after" in outputs[1].text
    assert fleet.nodes["n1"].poll() is None


def test_the_memory_limit_bounds_a_kernels_processes_together(fleet, tmp_path: Path):
    """Three children of one kernel, each taking 600 MB (each alone under the 1 GiB limit,
    which per-process rlimits would let live): together they pass it, and the OOM killer
    ends children, not the kernel."""
    found = run_probes(
        Client(fleet.redis_url),
        tmp_path,
        """
        import time
        children = []
        for _ in range(3):
            ready, told = os.pipe()
            pid = os.fork()
            if pid == 0:
                block = bytearray(600 * 1024**2)
                os.write(told, b"held")
                time.sleep(30)
                os._exit(0)
            os.close(told)
            os.read(ready, 4)  # "held", or nothing when the OOM killer took this child
            children.append(pid)
        time.sleep(1)
        found["codes"] = [os.waitpid(pid, os.WNOHANG)[1] for pid in children]
        for pid in children:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        """,
    )
    assert signal.SIGKILL in found["codes"], found["codes"]  # a wait status: killed


def test_without_cgroups_a_process_past_the_limit_gets_memory_error(tmp_path: Path):
    """ACTFLEET_KERNEL_CGROUPS=false (and wherever the node may not make cgroups): the
    limit is each process's address space; a cell passing it gets MemoryError, told the
    limit, and the kernel keeps its state."""
    settings = dataclasses.replace(
        Settings(), kernel_cgroups=False, kernel_memory=1024**3, kernel_start_timeout=60.0
    )

    async def grow() -> list[CellResult]:
        kernel = await Kernel.start(tmp_path / "solo", settings=settings)
        try:
            cells = ("x = 1", "block = bytearray(2 * 1024**3)", "print(x)")
            return [await kernel.execute(code) for code in cells]
        finally:
            await kernel.shutdown()

    _, grown, after = asyncio.run(grow())
    assert grown.status == "error" and "MemoryError" in grown.text
    assert "ACTFLEET_KERNEL_MEMORY=1073741824" in grown.text
    assert after.text == "1\n"


def test_a_fork_bomb_stops_at_the_process_limit_and_others_go_on(fleet, tmp_path: Path):
    client = Client(fleet.redis_url)
    bomb = """
        import time
        children = 0
        def fork():
            global children
            while True:
                if os.fork() == 0:
                    time.sleep(3)
                    os._exit(0)
                children += 1
        probe("fork", fork)
        found["children"] = children
        """
    found = run_probes(client, tmp_path, bomb)
    assert refused(found, "fork") and found["fork"][1] == "BlockingIOError"
    assert 0 < found["children"] < 64
    once = """
        def fork_once():
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            return os.waitpid(pid, 0)
        probe("fork", fork_once)
        """
    other = run_probes(client, tmp_path, once)
    assert not refused(other, "fork")
    assert fleet.nodes["n1"].poll() is None


def test_a_node_refuses_an_open_redis_unless_allowed(fleet_factory):
    with private_redis(password=False) as url:
        refused_start = cli(f"{url}/0", "worker", "--name", "open", timeout=60)
        assert refused_start.returncode == 3
        assert "needs no password" in refused_start.stderr
        assert "--allow-open-redis" in refused_start.stderr
        fleet = fleet_factory(f"{url}/0")
        fleet.start("open", "--allow-open-redis")
        assert "needs no password and kernels have network" in fleet.log("open")
        fleet.stop()


def test_the_node_environment_is_out_of_reach_under_a_wrapper(redis_url: str, fleet_factory):
    """`sh -c` (like tini in the image) stays between the node and its parent: neither the
    wrapper's nor the node's environment, both holding the key, is readable."""
    fleet = fleet_factory(redis_url, {"OPENAI_API_KEY": SECRET})
    log = open(fleet.workdir / "wrapped.log", "wb")  # noqa: SIM115 - lives with the node
    command = " ".join([*ACTFLEET, "worker", "--name", "wrapped"]) + "; exit $?"
    fleet.nodes["wrapped"] = wrapper = subprocess.Popen(
        ["sh", "-c", command], env=fleet.env, stdout=log, stderr=subprocess.STDOUT
    )
    wait_for(lambda: fleet.redis.exists("actfleet:node:wrapped"), 60, "the wrapped node")
    node = children(wrapper.pid)[0]
    try:
        assert SECRET in Path(f"/proc/{node}/environ").read_text(errors="replace")
        found = run_probes(
            Client(fleet.redis_url),
            fleet.workdir,
            f"""
            probe("wrapper", lambda: open("/proc/{wrapper.pid}/environ").read())
            probe("node", lambda: open("/proc/{node}/environ").read())
            probe("init", lambda: open("/proc/1/environ").read())
            found["own"] = repr(dict(os.environ))
            """,
        )
    finally:
        os.kill(node, signal.SIGTERM)  # the wrapper does not pass SIGTERM on
        wait_for(lambda: not Path(f"/proc/{node}").exists(), 60, "the wrapped node to stop")
    assert refused(found, "wrapper", "node", "init")
    assert SECRET not in found["own"]


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_node_and_a_client_without_the_password_say_so(redis_server: str):
    url = urlsplit(redis_server)
    without = f"redis://{url.hostname}:{url.port}/0"
    for command in (("worker", "--name", "nopass"), ("approvals",)):
        proc = cli(without, *command, timeout=60)
        assert proc.returncode == 3, proc.stderr
        assert "refused the credentials" in proc.stderr and "redis://:PASSWORD@" in proc.stderr


def test_without_bubblewrap_a_node_refuses_to_start_unless_told_no_sandbox(
    redis_url: str, fleet_factory, tmp_path: Path
):
    no_tools = {"PATH": str(tmp_path)}  # no bwrap, prlimit or setpriv on it
    refused_start = cli(redis_url, "worker", "--name", "bare", env=no_tools, timeout=60)
    assert refused_start.returncode == 3
    assert "bwrap is not installed" in refused_start.stderr
    assert "apt-get install -y bubblewrap" in refused_start.stderr
    assert "--no-sandbox" in refused_start.stderr
    fleet = fleet_factory(redis_url, no_tools)
    fleet.start("bare", "--no-sandbox")
    assert "kernels run WITHOUT a sandbox" in fleet.log("bare")


def test_the_demos_subagents_each_see_only_their_own_kernels_processes(fleet):
    """The bundled example's closing claim is what its subagents print."""
    client = Client(fleet.redis_url)
    example = files("actfleet") / "examples" / "subagents.jsonl"
    handle = client.submit("go", model=f"replay:{example}", approval="auto")
    assert client.wait(handle, timeout=120).status == "finished"
    outputs = [
        e.text
        for e in client.events(handle.session_id, follow=False)
        if isinstance(e, ev.CodeExecutionOutput)
    ]
    assert len(outputs) == 3
    assert all(text.strip() == "processes I can see: [1, 2]" for text in outputs), outputs


def test_a_kernel_that_outlived_its_node_is_killed_before_its_uid_is_used_again(
    tmp_path: Path,
):
    from actfleet.workers.sandbox import UidSlot

    base = 300_000 + os.getpid() % 1000 * 10
    orphan = subprocess.Popen(
        ["setpriv", f"--reuid={base}", f"--regid={base}", "--clear-groups", "sleep", "60"]
    )
    status = Path(f"/proc/{orphan.pid}/status")
    wait_for(lambda: f"Uid:\t{base}" in status.read_text(), 10, "the orphan to run as its uid")
    try:
        slot = UidSlot(base, lock_dir=tmp_path / "uids")
        assert slot.uid == base
        assert orphan.wait(10) == -signal.SIGKILL
        slot.release()
    finally:
        orphan.kill()


def test_the_private_tmp_is_mounted_before_anything_is_bound_below_it(tmp_path: Path):
    """A venv, a checkout or a workdir under /tmp must stay visible to the kernel."""
    from actfleet.broker.settings import Settings
    from actfleet.workers.sandbox import Sandbox

    args = Sandbox.from_settings(Settings()).command(tmp_path / "k", tmp_path / "w", ["x"], None)
    tmpfs = args.index("/tmp")
    assert args[tmpfs - 1] == "--tmpfs"
    binds = [i for i, arg in enumerate(args) if arg in ("--bind", "--ro-bind", "--dir")]
    assert binds and min(binds) > tmpfs


NOBODY = 65534


def reachable_by_others(paths: list[Path]) -> list[str]:
    """Shell commands that, in a private mount namespace, let any uid reach `paths` (and
    none when it already can): a tmpfs (0755) goes over each directory on the way that
    others cannot traverse, with what is needed of it bound back: the entry on the way to a
    path, or every entry when the directory is a path itself. A venv's python links into
    /root/.pyenv, /root is 0700, and so is a checkout made in `mktemp -d`."""
    through: dict[Path, set[str]] = {}
    for path in paths:
        for directory in reversed([path, *path.parents]):
            if not directory.stat().st_mode & stat.S_IXOTH:
                names = (
                    os.listdir(directory)
                    if directory == path
                    else [path.relative_to(directory).parts[0]]
                )
                through.setdefault(directory, set()).update(names)
    commands = ['stage="$(mktemp -d)"']
    for n, (blocked, names) in enumerate(sorted(through.items(), key=lambda kv: len(kv[0].parts))):
        kept = [(f'"$stage"/{n}-{i}', blocked / name) for i, name in enumerate(sorted(names))]
        bound = [(staged, child) for staged, child in kept if not child.is_symlink()]
        for staged, child in bound:
            make = "mkdir" if child.is_dir() else "touch"
            commands += [f"{make} {staged}", f"mount --bind {shlex.quote(str(child))} {staged}"]
        commands.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(blocked))}")
        for staged, child in kept:
            back = shlex.quote(str(child))
            if child.is_symlink():
                commands.append(f"ln -s {shlex.quote(os.readlink(child))} {back}")
                continue
            make, remove = ("mkdir", "rmdir") if child.is_dir() else ("touch", "rm")
            commands += [f"{make} {back}", f"mount --move {staged} {back}", f"{remove} {staged}"]
    return [*commands, 'rmdir "$stage"']


def as_nobody(argv: list[str]) -> list[str]:
    """`argv` run as uid and gid 65534 (nobody), in a mount namespace of its own where the
    interpreter, the venv and the checkout are reachable by that uid."""
    needed = {
        Path(os.path.realpath(sys.executable)).parent.parent,
        Path(sys.base_prefix),
        Path(sys.prefix),
        Path(actfleet.__file__).resolve().parents[1],
    }
    drop = f"exec setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups -- " + '"$@"'
    script = " && ".join([*reachable_by_others(sorted(needed)), drop])
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *argv]


@contextmanager
def nobody_node(redis_url: str, log_path: Path, wrapped: bool) -> Iterator[tuple[int, int]]:
    """A real `actfleet worker` run as nobody, directly or under `sh -c '...; exit $?'`,
    with the provider key in its environment and a workdir of its own; yields the pids of
    the node and of the process started (the wrapper, or the node itself)."""
    if os.geteuid() != 0:
        pytest.skip("starting a node as nobody needs root (to drop to uid 65534)")
    missing = [tool for tool in ("unshare", "setpriv") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (Debian: util-linux)")
    workdir = Path(tempfile.mkdtemp(prefix="actfleet-nobody-"))  # tmp_path: 0700, root's
    os.chown(workdir, NOBODY, NOBODY)
    fleet = Fleet(redis_url, workdir, {"OPENAI_API_KEY": SECRET})
    worker = [*ACTFLEET, "worker", "--name", "nobody"]
    argv = ["sh", "-c", shlex.join(worker) + "; exit $?"] if wrapped else worker
    with open(log_path, "wb") as log:
        outer = subprocess.Popen(
            as_nobody(argv), env=fleet.env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir
        )
    node = outer.pid

    def up() -> bool:
        if outer.poll() is not None:
            pytest.fail(f"the node exited with {outer.returncode}:\n{log_path.read_text()}")
        return bool(fleet.redis.exists("actfleet:node:nobody"))

    try:
        wait_for(up, 60, "the node run as nobody")
        if wrapped:
            node = children(outer.pid)[0]
        status = Path(f"/proc/{node}/status").read_text()
        assert f"Uid:\t{NOBODY}\t{NOBODY}\t{NOBODY}\t{NOBODY}\n" in status
        yield node, outer.pid
    finally:
        if Path(f"/proc/{node}").exists():
            os.kill(node, signal.SIGTERM)  # the wrapper does not pass SIGTERM on
        try:
            outer.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(node, signal.SIGKILL)
            outer.kill()
            outer.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("wrapped", [False, True], ids=["direct", "under-sh"])
def test_a_non_root_nodes_kernels_see_no_secret_and_cannot_reach_the_node(
    wrapped: bool, redis_url: str, tmp_path: Path
):
    """A node run as nobody, started directly or under `sh -c` (like tini): its kernels run
    as its uid in a user namespace, and still neither the node's nor the wrapper's nor
    init's environment, nor the provider key or the Redis password anywhere in /proc, is
    within their reach; nor can they signal the node."""
    password = urlsplit(redis_url).password
    assert password
    with nobody_node(redis_url, tmp_path / "nobody.log", wrapped) as (node, outer):
        assert SECRET in Path(f"/proc/{node}/environ").read_text(errors="replace")
        found = run_probes(
            Client(redis_url),
            tmp_path,
            f"""
            found["uid"] = os.getuid()
            probe("node", lambda: open("/proc/{node}/environ", "rb").read())
            probe("wrapper", lambda: open("/proc/{outer}/environ", "rb").read())
            probe("init", lambda: open("/proc/1/environ", "rb").read())
            probe("init memory", lambda: open("/proc/1/mem", "rb").read(1))
            probe("signal node", lambda: os.kill({node}, 0))
            found["view"] = "\\n".join(proc_view())
            """,
        )
    assert found["uid"] == NOBODY
    assert refused(found, "node", "wrapper", "init", "init memory", "signal node")
    assert SECRET not in found["view"] and password not in found["view"]


def test_a_non_root_node_without_a_writable_home_gives_its_kernels_the_font_list(
    redis_url: str, tmp_path: Path
):
    """matplotlib builds the node's font list in a temporary cache when HOME is not
    writable (the test's HOME is root's); the kernels get a copy all the same."""
    with nobody_node(redis_url, tmp_path / "nobody.log", wrapped=False):
        found = run_probes(
            Client(redis_url),
            tmp_path,
            """
            found["config"] = sorted(os.listdir(os.environ["MPLCONFIGDIR"]))
            """,
        )
    assert any(name.startswith("fontlist-") for name in found["config"]), found["config"]
