"""What every throwaway server shares: free ports, finding Debian's binaries, and a mirakuru
executor that waits on a real readiness probe and keeps the server's output in a log file."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from mirakuru import Executor
from mirakuru.exceptions import ProcessExitedWithError, TimeoutExpired

SETUP_HINT = "run `make test` (it runs scripts/setup-system.sh, which installs it)"


class ServerUnavailableError(RuntimeError):
    """A throwaway server could not be found or started; the message says why."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now (another process may still take it before us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def find_binary(names: Sequence[str], what: str, globs: Sequence[str] = ()) -> str:
    """The first match of ``globs`` (Debian's own paths, newest version first), else the
    first of ``names`` on PATH (or /usr/sbin, which a non-root PATH may lack); a clear
    error naming what to install otherwise."""
    for pattern in globs:
        matches = sorted(glob.glob(pattern), key=_version_key, reverse=True)
        if matches:
            return matches[0]
    search = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    for name in names:
        found = shutil.which(name, path=search)
        if found:
            return found
    tried = ", ".join([*names, *globs])
    raise ServerUnavailableError(f"{what} is not installed (looked for {tried}): {SETUP_HINT}")


def _version_key(path: str) -> list[int]:
    # /usr/lib/postgresql/16/bin/postgres sorts after .../9.6/...: compare numbers, not text.
    return [int(n) for n in re.findall(r"\d+", path)]


def unprivileged_user(preferred: Sequence[str] = ("nobody",)) -> pwd.struct_passwd | None:
    """The account to run a server that refuses root (PostgreSQL), or None when not root."""
    if os.geteuid() != 0:
        return None
    for name in preferred:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise ServerUnavailableError(f"no unprivileged user to run the server as (tried {preferred})")


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it, parents first, from /proc (a
    process group is not enough: PostgreSQL's children start sessions of their own)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid …": comm may hold spaces and parentheses
        parents[int(stat.parent.name)] = int(text[text.rindex(")") + 2 :].split()[1])
    tree = [root]
    for pid in tree:  # grows as it goes: breadth first
        tree.extend(child for child, parent in parents.items() if parent == pid)
    return tree


_PR_SET_PDEATHSIG = 1


def _new_session_dying_with_parent() -> None:
    """In the child before exec: its own session (mirakuru stops the whole group), and
    SIGTERM when pytest dies without tearing down (kill -9), so no server outlives the run.
    Runs after subprocess switched user, which would otherwise clear the death signal."""
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class ServerProcess(Executor):
    """A server process started by mirakuru in its own session; ready once ``probe`` says so.

    stdout and stderr go to ``log_path``: a pipe nobody reads would block a chatty server.
    """

    def __init__(
        self,
        command: list[str],
        *,
        probe: Callable[[], bool],
        log_path: Path,
        timeout: float = 60.0,
        envvars: dict[str, str] | None = None,
        stop_signal: int = signal.SIGTERM,
        user: pwd.struct_passwd | None = None,
        cwd: str | None = None,
    ) -> None:
        self._log_path = log_path
        self._log_file = open(log_path, "ab")  # noqa: SIM115 - closed in stop()/kill()
        self._probe = probe
        self._user = user
        self.startup_seconds = 0.0
        super().__init__(
            command,
            cwd=cwd,
            timeout=timeout,
            sleep=0.1,
            envvars=envvars,
            stop_signal=stop_signal,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    @property
    def _popen_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = super()._popen_kwargs
        kwargs["preexec_fn"] = _new_session_dying_with_parent
        if self._user is not None:
            kwargs["user"] = self._user.pw_uid
            kwargs["group"] = self._user.pw_gid
            kwargs["extra_groups"] = []
        return kwargs

    def pre_start_check(self) -> bool:
        # Ports are fresh, so nothing else can be "already running" there.
        return False

    def after_start_check(self) -> bool:
        try:
            return self._probe()
        except Exception:
            return False

    def start_or_explain(self, what: str) -> None:
        """start(), turning mirakuru's errors into one message with the server's log tail."""
        started = time.monotonic()
        try:
            self.start()
        except (ProcessExitedWithError, TimeoutExpired) as exc:
            self._log_file.close()
            raise ServerUnavailableError(
                f"{what} did not start ({exc}); log {self._log_path}:\n{log_tail(self._log_path)}"
            ) from exc
        self.startup_seconds = time.monotonic() - started

    def stop_quietly(self) -> None:
        """Stop, then kill if the server ignores the stop signal; never raises."""
        try:
            self.stop()
        except Exception:
            self.kill()
        finally:
            self._log_file.close()


class LocalServer:
    """A throwaway server: ``start()`` it, ``stop()`` it (its process, then its
    directory), or use it as a context manager. Subclasses start ``_process`` (a
    ServerProcess) in ``base_dir``."""

    base_dir: Path | None = None
    _process: ServerProcess | None = None
    #: False when the caller gave the directory: stop() leaves it
    _own_dir: bool = True

    def start(self) -> None:
        raise NotImplementedError

    @property
    def startup_seconds(self) -> float:
        return self._process.startup_seconds if self._process else 0.0

    def _stop_processes(self) -> None:
        if self._process is not None:
            self._process.stop_quietly()
            self._process = None

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Every process of the server stopped (SIGSTOP) for the block, then let go on:
        its connections stay open and it answers nothing, as a hung server or a network
        path that drops packets does."""
        if self._process is None or self._process.process is None:
            raise ServerUnavailableError("the server is not running")
        root = self._process.process.pid
        os.kill(root, signal.SIGSTOP)  # first: a stopped parent starts no more children
        tree = process_tree(root)
        try:
            for pid in tree[1:]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            yield
        finally:
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        self._stop_processes()
        if self._own_dir and self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
