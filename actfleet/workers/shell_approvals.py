"""How `!cmd` inside a kernel asks its node for approval: over the kernel's own Jupyter
stdin channel, the channel Jupyter has for a cell that waits on its frontend.

The kernel's init code replaces IPython's shell hooks (`!cmd`, `!!cmd`, `%%bash`, `%%sh`)
with ones that call the kernel's `raw_input` with a prompt carrying the command; the node,
which serves the stdin channel while a cell runs, decides and answers. No TCP port and no
server are involved, so this works in a sandbox without network, and a request can only
reach the node that runs the cell. The node only ever answers yes or no: nothing a kernel
sends makes the node start a process.

The guard against `subprocess`, `os.system` and the `exec`/`spawn` family is a convenience
that turns direct calls into a clear error telling the model to use `!`; it is not a
security boundary (code can get around it). The sandbox is the boundary (docs/security.md).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ("APPROVED", "REJECTED", "init_code", "shell_request")

PROMPT = "\x1eactfleet-shell\x1e"
"""Marks a stdin request as a shell-approval request; the JSON `{"cmd": ...}` follows."""
APPROVED = "approved"
REJECTED = "rejected"

_INIT = """\
import os as _os
get_ipython().run_line_magic('colors', 'nocolor')
for _k in ('CLICOLOR', 'CLICOLOR_FORCE', 'FORCE_COLOR'):
    _os.environ.pop(_k, None)
_os.environ.update(TERM='dumb', NO_COLOR='1')
_os.chdir(CODE_DIR)

def _actfleet_restore_cwd(result=None, _cwd=CODE_DIR, _os=_os):
    try:
        here = _os.getcwd()
    except FileNotFoundError:
        here = None
    if here != _cwd:
        _os.chdir(_cwd)
        print(f'[actfleet] working directory reset to {_cwd}')
get_ipython().events.register('post_run_cell', _actfleet_restore_cwd)

def _actfleet_install_shell_guard():
    import contextvars, json, os, subprocess

    class ShellCommandRejected(PermissionError):
        '''The node did not approve this shell command.'''

    ip = get_ipython()
    allowed = contextvars.ContextVar('actfleet_shell_allowed', default=False)

    def ask(cmd):
        answer = ip.kernel.raw_input(PROMPT + json.dumps({'cmd': cmd}))
        if answer != APPROVED:
            raise ShellCommandRejected(f'shell command was not approved: {cmd}')

    def approved(run):
        # The command is expanded ($name, {expr}) here, in the cell's frame, as IPython
        # would; the expanded text is asked for and run as it is, never expanded again.
        def hook(cmd, *args, **kwargs):
            expanded = ip.var_expand(cmd, depth=1 + kwargs.get('depth', 0))
            ask(expanded)
            token = allowed.set(True)
            ip.var_expand = lambda cmd, *args, **kwargs: cmd
            try:
                return run(expanded, *args, **kwargs)
            finally:
                del ip.var_expand
                allowed.reset(token)
        return hook

    ip.system = approved(ip.system)
    ip.getoutput = approved(ip.getoutput)
    for name in ('bash', 'sh'):
        magic = ip.find_cell_magic(name)
        if magic is not None:
            def cell_magic(line, cell, _magic=magic):
                ask(cell)
                token = allowed.set(True)
                try:
                    return _magic(line, cell)
                finally:
                    allowed.reset(token)
            ip.register_magic_function(cell_magic, magic_kind='cell', magic_name=name)

    def guarded(function, what):
        def guard(*args, **kwargs):
            if not allowed.get():
                raise RuntimeError(f'Direct {what} calls are not allowed. Use ! syntax.')
            return function(*args, **kwargs)
        return guard

    class GuardedPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            if not allowed.get():
                raise RuntimeError('Direct subprocess calls are not allowed. Use ! syntax.')
            super().__init__(*args, **kwargs)

    subprocess.Popen = GuardedPopen
    os.system = guarded(os.system, 'os.system()')
    for name in dir(os):
        if name.startswith(('exec', 'spawn', 'posix_spawn')) and callable(getattr(os, name)):
            setattr(os, name, guarded(getattr(os, name), f'os.{name}()'))

_actfleet_install_shell_guard()
del _os, _k, _actfleet_restore_cwd, _actfleet_install_shell_guard
"""


def init_code(code_dir: Path) -> str:
    """The code run in every fresh kernel process: working directory (kept across cells),
    plain-text output, and the shell hooks asking over the stdin channel."""
    constants = {"CODE_DIR": str(code_dir), "PROMPT": PROMPT, "APPROVED": APPROVED}
    code = _INIT
    for name, value in constants.items():
        code = code.replace(name, repr(value))
    return code


def shell_request(prompt: str) -> str | None:
    """The command of a stdin request made by the shell hooks; `None` for any other
    request (a plain `input()` in the cell)."""
    if not prompt.startswith(PROMPT):
        return None
    try:
        request = json.loads(prompt[len(PROMPT) :])
    except ValueError:
        return None
    cmd = request.get("cmd") if isinstance(request, dict) else None
    return cmd if isinstance(cmd, str) else None
