"""The kernel layer against real ipykernel processes: output, death, timeouts, caps, the warm
pool, and shell-command approval."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from actfleet.broker.settings import Settings
from actfleet.workers.kernel import Kernel
from actfleet.workers.kernel_pool import KernelPool

SETTINGS = dataclasses.replace(
    Settings(), execution_timeout=30.0, interrupt_grace=1.0, kernel_start_timeout=60.0
)
PNG = base64.b64decode(  # a 1x1 transparent PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)


def run(test: Callable[..., Awaitable[None]], *args: Any) -> None:
    asyncio.run(test(*args))


@asynccontextmanager
async def kernels(tmp: Path, count: int = 1, *, warm: int = 0, concurrency: int = 2):
    async with KernelPool(warm, concurrency, settings=SETTINGS) as pool:
        yield await asyncio.gather(*(pool.acquire(tmp / f"work{i}") for i in range(count)))


@pytest.fixture
def cpu_burners() -> Iterator[None]:
    """Two processes spinning on the CPU for the duration of the test."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def test_print_output_arrives_complete_and_in_order_under_cpu_load(
    tmp_path: Path, cpu_burners: None
) -> None:
    async def test() -> None:
        async with kernels(tmp_path) as (kernel,):
            streamed: list[str] = []
            for i in range(1000):
                result = await kernel.execute(f"print({i})", on_output=streamed.append)
                assert (result.status, result.text) == ("ok", f"{i}\n")
            assert "".join(streamed) == "".join(f"{i}\n" for i in range(1000))

    run(test)


def test_kernel_death_is_reported_and_next_cell_gets_fresh_guarded_kernel(tmp_path: Path) -> None:
    async def test() -> None:
        async with kernels(tmp_path) as (kernel,):
            await kernel.execute("x = 1")
            died = await kernel.execute("import os; os._exit(1)")
            assert died.status == "died"
            assert "Kernel died while executing; its state was lost." in died.text

            fresh = await kernel.execute("import os; print('x' in globals(), os.getcwd())")
            assert fresh.text == f"False {kernel.code_dir}\n"
            guarded = await kernel.execute("import subprocess; subprocess.run(['true'])")
            assert guarded.status == "error"
            assert "RuntimeError: Direct subprocess calls are not allowed" in guarded.text
            assert "\x1b" not in guarded.text
            shell = await kernel.execute("!echo hi")
            assert (shell.status, shell.text.splitlines()) == ("ok", ["hi"])  # via a pty: \\r\\n

    run(test)


def test_timeout_interrupts_and_keeps_state_or_restarts_a_stubborn_cell(tmp_path: Path) -> None:
    async def test() -> None:
        async with kernels(tmp_path) as (kernel,):
            await kernel.execute("x = 1")
            looped = await kernel.execute("while True: pass", timeout=1)
            assert looped.status == "interrupted"
            assert "KeyboardInterrupt" in looped.text
            assert "the kernel kept its state" in looped.text
            assert (await kernel.execute("print(x)")).text == "1\n"

            stubborn = await kernel.execute(
                "import time\nwhile True:\n    try:\n        time.sleep(0.01)\n"
                "    except KeyboardInterrupt:\n        pass",
                timeout=1,
            )
            assert stubborn.status == "restarted"
            assert "the kernel was restarted and its state was lost" in stubborn.text
            after = await kernel.execute("print('x' in globals())")
            assert (after.status, after.text) == ("ok", "False\n")

    run(test)


def test_large_output_is_previewed_kept_in_full_and_does_not_break_the_kernel(
    tmp_path: Path,
) -> None:
    cap = SETTINGS.output_cap

    async def test() -> None:
        async with kernels(tmp_path) as (kernel,):
            streamed: list[str] = []
            big = await kernel.execute(
                "print('<' + 'a' * 40_000 + '|' + 'b' * 40_000 + '>')", on_output=streamed.append
            )
            assert big.status == "ok" and big.truncated
            assert big.full_text == "<" + "a" * 40_000 + "|" + "b" * 40_000 + ">\n"
            assert len(big.text.encode()) <= cap
            assert big.text.startswith("<aaa") and big.text.endswith("bbb>\n")
            assert "bytes of output omitted" in big.text and "|" not in big.text
            assert len("".join(streamed).encode()) == cap

            huge = await kernel.execute("for _ in range(10_000): print('y' * 999)")
            assert huge.status == "ok" and huge.truncated
            assert huge.full_text is not None and len(huge.full_text) == 10_000_000
            assert (await kernel.execute("print('still here')")).text == "still here\n"

    run(test)


SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4"/></svg>'


def test_displayed_images_are_saved_in_the_working_directory_and_named_to_the_model(
    tmp_path: Path,
) -> None:
    async def test() -> None:
        async with kernels(tmp_path) as (kernel,):
            result = await kernel.execute(
                "from IPython.display import SVG, Image, display\n"
                f"display(Image(data={PNG!r}))\ndisplay(SVG({SVG!r}))\n"
                "display({'image/png': 'not base64!'}, raw=True)\n"
                "display({'image/jpeg': 'iVBORw0KGgo='}, raw=True)\nprint('done')"
            )
            assert result.status == "ok"
            png, svg = result.images
            assert (png.media_type, png.data) == ("image/png", PNG)
            assert (svg.media_type, svg.data) == ("image/svg+xml", SVG.encode())
            for image in (png, svg):
                saved = kernel.working_dir / image.path
                assert image.path.startswith("images/") and saved.read_bytes() == image.data
                assert saved.stat().st_uid == kernel.working_dir.stat().st_uid
                assert f"![image]({kernel.code_dir / image.path})" in result.text
            assert "image/png: not valid base64" in result.text
            assert "image/jpeg: not a JPG image" in result.text
            assert result.text.startswith("done\n")

            # The kernel owns its working directory: an `images` symlink is not followed.
            outside = tmp_path / "outside"
            outside.mkdir()
            await kernel.execute(
                "import os, shutil\nshutil.rmtree('images')\n"
                f"os.symlink({str(outside)!r}, 'images')"
            )
            hijacked = await kernel.execute(f"display(Image(data={PNG!r}))")
            assert hijacked.images == () and "An image was not kept" in hijacked.text
            assert list(outside.iterdir()) == []

    run(test)


def test_eight_kernels_requested_at_once_all_come_up(tmp_path: Path) -> None:
    async def test() -> None:
        async with kernels(tmp_path, 8, warm=2, concurrency=2) as all_eight:
            # Each kernel's connection file is its own (pids repeat across PID namespaces).
            results = [
                await k.execute("import sys; print(sys.argv[sys.argv.index('-f') + 1])")
                for k in all_eight
            ]
            assert [r.status for r in results] == ["ok"] * 8
            assert len({r.text for r in results}) == 8

    run(test)


def test_kernels_do_not_inherit_provider_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = ["OPENAI_API_KEY", "ACTFLEET_REDIS_URL", "MY_TOKEN", "db_password", "GEMINI_X"]
    for name in secrets:
        monkeypatch.setenv(name, "s3cret")
    monkeypatch.setenv("PLAIN_SETTING", "visible")

    async def test() -> None:
        async with kernels(tmp_path) as (kernel,):
            result = await kernel.execute(f"import os; print([n in os.environ for n in {secrets}])")
            assert result.text == f"{[False] * len(secrets)}\n"
            plain = await kernel.execute("print(os.environ['PLAIN_SETTING'])")
            assert plain.text == "visible\n"

    run(test)


def test_shell_approval_wait_does_not_count_against_the_timeout(tmp_path: Path) -> None:
    asked: list[str] = []

    async def slow_yes(cmd: str) -> bool:
        asked.append(cmd)
        await asyncio.sleep(5)  # a human taking their time, not synchronisation
        return True

    async def test() -> None:
        async with kernels(tmp_path) as (kernel,):
            result = await kernel.execute("!echo ran >> log.txt", timeout=2, on_shell=slow_yes)
            assert result.status == "ok", result.text
            assert asked == ["echo ran >> log.txt"]
            assert (kernel.working_dir / "log.txt").read_text() == "ran\n"

    run(test)


class Approver:
    """An `on_shell` that approves every command and records each one asked about."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, cmd: str) -> bool:
        self.asked.append(cmd)
        return True


def test_the_command_asked_for_is_the_command_run_after_expansion(tmp_path: Path) -> None:
    yes = Approver()
    asked = yes.asked

    async def test() -> None:
        async with kernels(tmp_path) as (kernel,):
            code = "x = '; echo injected'\ny = '$x'\n!echo {1 + 1} $x $y"
            result = await kernel.execute(code, on_shell=yes)
            assert result.status == "ok", result.text
            assert asked == ["echo 2 ; echo injected $x"]
            assert result.text.split() == ["2", "injected"]  # run once, as asked
            listing = await kernel.execute("files = !ls -a\nprint(files)", on_shell=yes)
            assert asked[-1] == "ls -a" and "'.'" in listing.text

    run(test)


def test_bash_and_sh_cells_ask_once_each_and_run(tmp_path: Path) -> None:
    yes = Approver()
    asked = yes.asked

    async def test() -> None:
        async with kernels(tmp_path) as (kernel,):
            bash = await kernel.execute("%%bash\necho from bash\n", on_shell=yes)
            sh = await kernel.execute("%%sh\necho from sh\n", on_shell=yes)
            assert (bash.status, sh.status) == ("ok", "ok"), bash.text + sh.text
            assert "from bash" in bash.text and "from sh" in sh.text
            assert asked == ["echo from bash\n", "echo from sh\n"]

    run(test)


def test_rejected_shell_command_raises_in_the_cell_and_does_not_run(tmp_path: Path) -> None:
    async def no(cmd: str) -> bool:
        return False

    async def test() -> None:
        async with kernels(tmp_path) as (kernel,):
            result = await kernel.execute("!touch rejected.txt", on_shell=no)
            assert result.status == "error"
            assert "ShellCommandRejected" in result.text and "not approved" in result.text
            assert not (kernel.working_dir / "rejected.txt").exists()

    run(test)


def test_two_kernels_asking_at_once_each_reach_their_own_callback(tmp_path: Path) -> None:
    async def test() -> None:
        async with kernels(tmp_path, 2) as (first, second):
            asked: dict[str, list[str]] = {"first": [], "second": []}
            both_asking = asyncio.Event()

            def callback(name: str) -> Callable[[str], Awaitable[bool]]:
                async def on_shell(cmd: str) -> bool:
                    asked[name].append(cmd)
                    if all(asked.values()):
                        both_asking.set()
                    await both_asking.wait()  # both requests are pending at the same time
                    return True

                return on_shell

            results = await asyncio.wait_for(
                asyncio.gather(
                    first.execute("!echo one", on_shell=callback("first")),
                    second.execute("!echo two", on_shell=callback("second")),
                ),
                timeout=30,
            )
            assert [r.text.split() for r in results] == [["one"], ["two"]]
            assert asked == {"first": ["echo one"], "second": ["echo two"]}

    run(test)


def test_kernel_works_without_a_pool(tmp_path: Path) -> None:
    async def test() -> None:
        kernel = await Kernel.start(tmp_path / "solo", settings=SETTINGS)
        try:
            result = await kernel.execute("import os; print(os.getcwd())")
            assert result.text == f"{kernel.code_dir}\n"
        finally:
            await kernel.shutdown()
        assert kernel.closed

    run(test)


def test_the_first_shell_command_of_a_fresh_kernel_is_asked_not_lost(tmp_path: Path) -> None:
    """Found under load: a kernel used the moment it came up sent its first approval
    request before the node's stdin connection was complete, the kernel dropped it, and the
    cell hung until its timeout. Each of 12 kernels, used at once, asks and runs."""

    async def test() -> None:
        asked: list[str] = []

        async def ask(cmd: str) -> bool:
            asked.append(cmd)
            return True

        async with KernelPool(0, 2, settings=SETTINGS) as pool:
            for i in range(12):
                kernel = await pool.acquire(tmp_path / f"w{i}")
                result = await kernel.execute("!echo hi", on_shell=ask, timeout=5)
                assert (result.status, result.text.splitlines()) == ("ok", ["hi"]), i
                await kernel.shutdown()
        assert asked == ["echo hi"] * 12

    run(test)
