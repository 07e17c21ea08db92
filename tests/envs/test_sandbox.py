"""The agentic sandbox, checked from the host side on every isolating backend that runs here.

Each test does something an escaping or runaway episode would do, then looks at the host (a
listener's backlog, the host filesystem, /proc) rather than trusting what the sandbox printed.
"""
from __future__ import annotations

import logging
import os
import resource
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from envs.agentic.sandbox import (
    ISOLATING_BACKENDS, SANDBOX_ENV, SANDBOX_UID, TOOLCHAIN, WORKSPACE, CommandResult, Sandbox, SandboxError,
    SandboxLimits, _probe, available_backends, docker_command,
)
from envs.agentic.toolchain import PINS

REPO = Path(__file__).resolve().parents[2]
SMALL = SandboxLimits(memory_mb=256, max_processes=64, file_size_mb=8, cpu_s=2, timeout_s=5, tmp_mb=16,
                      max_output_bytes=4096)


@pytest.fixture(params=ISOLATING_BACKENDS)
def backend(request) -> str:
    problem = _probe(request.param)
    if problem is not None:
        pytest.skip(f"the {request.param} backend cannot run on this machine: {problem}")
    return request.param


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A task's workspace directory, as an environment would hand it to the sandbox."""
    src = tmp_path / "task-workspace"
    src.mkdir()
    (src / "a.txt").write_text("original\n")
    return src


@pytest.fixture
def box(backend: str, source: Path):
    with Sandbox(source, backend=backend, limits=SMALL) as sandbox:
        yield sandbox


def marker() -> str:
    return f"sbx-marker-{uuid.uuid4().hex}"


def processes_with(text: str) -> list[int]:
    """Host pids whose command line contains `text` (other than this test process)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry))
    return found


# --- isolation ---


def test_no_network_reaches_a_host_listener(box: Sandbox):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        result = box.run(
            f"(exec 3<>/dev/tcp/127.0.0.1/{port}) && echo CONNECTED-BASH\n"
            f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2)' "
            "&& echo CONNECTED-PY")
        with pytest.raises(BlockingIOError):  # nothing ever reached the host's listener
            listener.accept()
    finally:
        listener.close()
    assert "CONNECTED" not in result.output
    net_dev = box.run("cat /proc/net/dev").output.splitlines()[2:]  # after two header lines
    assert [line.split(":")[0].strip() for line in net_dev] == ["lo"]  # no interface leads out


def test_host_files_are_invisible(box: Sandbox, tmp_path: Path):
    secret_text = f"TOPSECRET-{uuid.uuid4().hex}"
    secret = tmp_path / "secret.txt"
    secret.write_text(secret_text)
    home = Path.home()  # the host user's home: its dotfiles must not be readable inside
    result = box.run(f"cat {secret}; cat {home / '.bashrc'}; ls -A /tmp {tmp_path} {home} /home {REPO}")
    assert secret_text not in result.output
    assert result.exit_code != 0
    for path in (secret, tmp_path, tmp_path.parents[1], home, "/home", REPO):
        assert box.run(f"test -e {path}").exit_code == 1, f"{path} is visible inside the sandbox"
    assert box.run("ls -A /tmp").output == ""  # a private /tmp, not the host's


def test_writes_outside_the_workspace_leave_the_host_unchanged(box: Sandbox, tmp_path: Path):
    tag = marker()
    targets = [Path(f"/usr/{tag}"), Path(f"/etc/{tag}"), Path(f"/dev/{tag}"), Path(f"/{tag}"), tmp_path / tag]
    try:
        result = box.run("".join(f"echo pwned > {t}\n" for t in targets) + f"echo inside > /tmp/{tag}\n"
                         f"echo kept > {WORKSPACE}/{tag}\n")
        for target in targets + [Path(tempfile.gettempdir()) / tag]:
            assert not target.exists(), f"the sandbox wrote {target} on the host"
        assert result.output.count("Read-only file system") + result.output.count("No such file") >= len(targets)
        assert (box.workspace_path / tag).read_text() == "kept\n"  # the workspace is the one writable place
        assert os.stat(box.workspace_path / tag).st_uid in (SANDBOX_UID, os.getuid())
    finally:
        for target in targets:
            target.unlink(missing_ok=True)


def test_the_host_environment_is_invisible(box: Sandbox, monkeypatch: pytest.MonkeyPatch):
    key = f"sk-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    result = box.run("env; cat /proc/1/environ /proc/self/environ")
    assert key not in result.output and "OPENAI_API_KEY" not in result.output
    env = dict(line.split("=", 1) for line in box.run("env").output.splitlines())
    assert {k: env[k] for k in SANDBOX_ENV} == SANDBOX_ENV
    assert set(env) <= set(SANDBOX_ENV) | {"PWD", "SHLVL", "_"}  # the rest are bash's own
    assert box.run("command -v python3 && python3 -c 'print(6 * 7)'").output == f"{TOOLCHAIN}/bin/python3\n42\n"


def test_commands_have_no_privileges_and_no_namespaces_of_their_own(box: Sandbox):
    status = box.run("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; id -u; hostname").output.split()
    assert status == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1", str(SANDBOX_UID), "sandbox"]
    result = box.run("unshare --user --net true")  # nested namespaces widen the kernel's attack surface
    assert result.exit_code != 0, result.output


def test_the_test_toolchain_is_on_path_pinned_and_read_only(box: Sandbox):
    versions = {pin.name: pin.version for pin in PINS}
    result = box.run("command -v python3 pytest && pytest --version && python3 -I -m pytest --version --version")
    lines = result.output.splitlines()
    assert result.exit_code == 0 and lines[:3] == [f"{TOOLCHAIN}/bin/python3", f"{TOOLCHAIN}/bin/pytest",
                                                   f"pytest {versions['pytest']}"], result.output
    site = box.run("python3 -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))'").output.strip()
    assert site.startswith(f"{TOOLCHAIN}/lib/python3.") and site.endswith("/site-packages")
    assert lines[3].startswith(f"This is pytest version {versions['pytest']}, imported from {site}/pytest/")
    plugins = [line.split()[0] for line in lines[5:]]  # after "registered third-party plugins:"
    assert plugins == [f"pytest-timeout-{versions['pytest-timeout']}", f"pytest-mock-{versions['pytest-mock']}"]
    # the standard library and the toolchain only: nothing of the host's site-packages is imported
    sys_path = box.run("python3 -c 'import sys; print(*sys.path[1:], sep=chr(10))'").output.split()
    assert [p for p in sys_path if "-packages" in p] == [site]

    before = sorted((str(p), p.read_bytes() if p.is_file() else b"") for p in box.toolchain_path.rglob("*"))
    tag = marker()
    writes = [f"touch {TOOLCHAIN}/{tag}", f"echo x >> {TOOLCHAIN}/bin/pytest", f"mkdir {site}/{tag}",
              f"rm -f {TOOLCHAIN}/pyvenv.cfg", f"mv {site}/pytest {site}/{tag}", f"chmod 777 {TOOLCHAIN}/bin"]
    for command in writes:  # refused by the file's mode (the sandbox's user owns nothing there) or by the mount
        result = box.run(command)
        assert result.exit_code != 0 and ("Read-only file system" in result.output
                                          or "Permission denied" in result.output), (command, result.output)
    mounts = [line.split() for line in box.run("cat /proc/self/mountinfo").output.splitlines()]
    assert [m[5].split(",")[0] for m in mounts if m[4] == TOOLCHAIN] == ["ro"]  # the mount itself is read-only
    assert sorted((str(p), p.read_bytes() if p.is_file() else b"") for p in box.toolchain_path.rglob("*")) == before
    assert box.run(f"test -e {box.toolchain_path}").exit_code == 1  # seen only at {TOOLCHAIN}


# --- limits: each runaway is stopped, says which limit, and leaves no process behind ---

RUNAWAYS = {
    # name: (command with {m} for the marker, timeout_s, expected limit_hit)
    "fork bomb": ("bomb() {{ bomb | bomb & }}; bomb; sleep 60 # {m}", 3, "processes"),
    "memory hog": ("python3 -c 'x = [bytearray(64 << 20) for _ in range(64)]  # {m}'", 5, "memory"),
    "disk filler": ("head -c 1G /dev/zero > filler.bin # {m}", 5, "file_size"),
    "disk filler (python)": ("python3 -c 'f = open(\"filler.bin\", \"wb\")\nwhile 1: f.write(bytes(1 << 20))  # {m}'",
                             5, "file_size"),
    "cpu spinner": ("while :; do :; done # {m}", 60, "cpu"),  # 2 s of CPU, however loaded the machine
    "sleep forever": ("sleep infinity & setsid sleep infinity & nohup sleep infinity & sleep infinity # {m}", 2,
                      "timeout"),
}


@pytest.mark.parametrize("name", list(RUNAWAYS))
def test_runaways_are_stopped_by_their_limit(box: Sandbox, name: str):
    command, timeout_s, limit = RUNAWAYS[name]
    tag = marker()
    peak = 0  # the most processes of this command seen at once, from the host

    def watch() -> None:
        nonlocal peak
        while thread.is_alive():
            peak = max(peak, len(processes_with(tag)))
            time.sleep(0.05)

    thread = threading.Thread(target=lambda: results.append(box.run(command.format(m=tag), timeout_s=timeout_s)))
    results: list[CommandResult] = []
    thread.start()
    watch()
    result = results[0]
    assert processes_with(tag) == [], f"{name} left processes behind"
    # Each process of the command carries the marker in its command line, and so does the launcher
    # outside the namespace: the process limit holds to within that one.
    assert peak <= SMALL.max_processes + 1
    if limit == "processes":
        assert peak >= SMALL.max_processes // 2  # the bomb really ran into the limit
    assert result.limit_hit == limit, result
    assert result.wall_s < timeout_s + 3
    assert result.exit_code != 0
    if limit == "timeout":
        assert result.timed_out and result.exit_code is None and result.signal == 9
    filler = box.workspace_path / "filler.bin"
    if name.startswith("disk filler"):
        assert filler.stat().st_size <= SMALL.file_size_mb << 20


def test_background_processes_do_not_outlive_their_command(box: Sandbox):
    tag = marker()
    result = box.run(f"sleep 1000 & setsid sleep 1000 & echo started # {tag}")
    assert result.output == "started\n" and result.exit_code == 0 and not result.timed_out
    assert result.wall_s < 30  # not the 1,000 s of the background sleeps
    assert processes_with(tag) == []


def test_close_kills_a_running_command(backend: str, source: Path):
    tag = marker()
    results: list[CommandResult] = []
    sandbox = Sandbox(source, backend=backend, limits=SMALL)
    thread = threading.Thread(target=lambda: results.append(sandbox.run(f"sleep 1000 # {tag}", timeout_s=60)))
    thread.start()
    deadline = time.monotonic() + 5
    while not processes_with(tag) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert processes_with(tag), "the command never started"
    sandbox.close()
    thread.join(timeout=5)
    assert not thread.is_alive() and results and results[0].exit_code != 0
    assert processes_with(tag) == []
    assert not sandbox.workspace_path.exists()


# --- results ---


def test_long_output_keeps_head_and_tail_and_the_exit_code(box: Sandbox):
    result = box.run("seq 1 100000; echo done >&2; exit 7")
    total = len("".join(f"{i}\n" for i in range(1, 100001))) + len("done\n")
    assert result.exit_code == 7 and result.truncated and result.limit_hit is None
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("99999\n100000\ndone\n")
    assert f"\n...[{total - SMALL.max_output_bytes} bytes cut]...\n" in result.output
    assert len(result.output) < SMALL.max_output_bytes + 100


def test_stdin_exit_code_and_working_directory(box: Sandbox):
    result = box.run("cat; pwd; exit 4", stdin="hello\n")
    assert result == CommandResult(exit_code=4, output=f"hello\n{WORKSPACE}\n", timed_out=False, truncated=False,
                                   wall_s=result.wall_s, signal=None, limit_hit=None)


def test_per_command_overhead_is_small(box: Sandbox):
    overhead = box.overhead_s()
    print(f"{box.backend_name} overhead per command: {overhead * 1000:.1f} ms")
    assert overhead < 5  # a sanity bound: a loaded machine is slow; `clawr1 bench` reports the real cost


# --- workspaces and files ---


def test_every_sandbox_gets_a_fresh_workspace(backend: str, source: Path):
    with Sandbox(source, backend=backend, limits=SMALL) as first:
        assert first.run("echo changed > a.txt; echo new > b.txt").exit_code == 0
        assert (first.workspace_path / "b.txt").read_text() == "new\n"
        first_copy = first.workspace_path
    assert not first_copy.exists()  # deleted at close
    with pytest.raises(SandboxError, match="closed"):
        first.run("true")
    with Sandbox(source, backend=backend, limits=SMALL) as second:
        assert second.run("cat a.txt; ls").output == "original\na.txt\n"
    assert (source / "a.txt").read_text() == "original\n" and sorted(os.listdir(source)) == ["a.txt"]


def test_file_methods_stay_inside_the_workspace(box: Sandbox, tmp_path: Path):
    passwd = Path("/etc/passwd").read_bytes()
    assert box.run("ln -s /etc evil-dir; ln -s /etc/passwd evil-file; mkfifo pipe").exit_code == 0
    for bad in ("../x", "/etc/x", "evil-dir/passwd", "evil-file", "sub/../../x"):
        with pytest.raises(SandboxError):
            box.write_file(bad, "pwned")
    for bad in ("evil-file", "evil-dir/passwd", "../task-workspace/a.txt", "pipe"):
        with pytest.raises(SandboxError):
            box.read_file(bad)
    assert Path("/etc/passwd").read_bytes() == passwd

    box.write_file("sub/dir/f.txt", "hi\n")
    assert box.run("echo more >> sub/dir/f.txt && cat sub/dir/f.txt").output == "hi\nmore\n"
    assert box.read_file("sub/dir/f.txt") == "hi\nmore\n"
    assert box.read_file("sub/dir/f.txt", max_bytes=2) == "hi\n...[6 bytes cut]...\n"

    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_real.py").write_text("real\n")
    box.run("mkdir tests && echo fake > tests/test_real.py && ln -s /etc tests/etc-link")
    box.copy_in(tests, "tests")  # replaces whatever the episode left there
    assert sorted(os.listdir(box.workspace_path / "tests")) == ["test_real.py"]
    assert box.run("cat tests/test_real.py && touch tests/writable").output == "real\n"


# --- backend choice ---


def test_local_is_refused_unless_explicitly_allowed(source: Path, caplog: pytest.LogCaptureFixture):
    with pytest.raises(SandboxError, match="allow_unsafe_local"):
        Sandbox(source, backend="local")
    with caplog.at_level(logging.WARNING, logger="envs.agentic.sandbox"):
        with Sandbox(source, backend="local", limits=SMALL, allow_unsafe_local=True) as sandbox:
            assert sandbox.backend_name == "local"
            assert sandbox.run("cat a.txt").output == "original\n"
            # no process limit of its own: without a user namespace RLIMIT_NPROC would count every process of the
            # uid on the host (every sandbox's, as root), and a busy neighbour would make this sandbox's forks fail
            host_limit = resource.getrlimit(resource.RLIMIT_NPROC)[0]
            assert sandbox.run("ulimit -u").output.strip() == \
                ("unlimited" if host_limit == resource.RLIM_INFINITY else str(host_limit))
    assert "UNSAFE" in caplog.text


def test_auto_picks_bwrap_here_and_says_so(source: Path, caplog: pytest.LogCaptureFixture):
    problem = _probe("bwrap")
    if problem is not None:
        pytest.skip(f"bwrap cannot run on this machine: {problem}")
    assert available_backends()[0] == "bwrap"
    with caplog.at_level(logging.INFO, logger="envs.agentic.sandbox"):
        with Sandbox(source, limits=SMALL) as sandbox:
            assert sandbox.backend_name == "bwrap"
    assert "sandbox backend: bwrap" in caplog.text


def test_unknown_and_docker_backends_are_refused(source: Path):
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        Sandbox(source, backend="chroot")
    with pytest.raises(SandboxError, match="docker_command"):
        Sandbox(source, backend="docker")


def test_docker_command_contract(tmp_path: Path):
    argv = docker_command("python:3.11-slim", tmp_path, "pytest -q", SMALL, name="episode-1")

    def value(option: str) -> list[str]:
        return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == option]

    image_at = argv.index("python:3.11-slim")
    assert argv[:2] == ["docker", "run"] and "--rm" in argv
    assert argv[image_at:] == ["python:3.11-slim", "/bin/bash", "-c", "pytest -q"]
    options = argv[:image_at]
    assert value("--network") == ["none"]
    assert "--read-only" in options
    assert value("--memory") == ["256m"] and value("--memory-swap") == ["256m"]
    assert value("--pids-limit") == ["64"]
    assert sorted(value("--ulimit")) == ["core=0", "cpu=2:3", f"fsize={8 << 20}"]
    assert value("--cap-drop") == ["ALL"] and value("--security-opt") == ["no-new-privileges"]
    assert value("--user") == [f"{SANDBOX_UID}:{SANDBOX_UID}"]
    assert value("--tmpfs") == ["/tmp:rw,nosuid,nodev,size=16m"]
    assert value("--mount") == [f"type=bind,source={tmp_path.resolve()},target={WORKSPACE}"]
    assert value("--workdir") == [WORKSPACE] and value("--name") == ["episode-1"]
    # The environment is written out in full; nothing is passed through from the host.
    assert value("--env") == [f"{k}={v}" for k, v in SANDBOX_ENV.items()]
    for forbidden in ("-e", "--env-file", "--privileged", "--volumes-from", "--pid", "--ipc=host", "--net"):
        assert forbidden not in options
    assert not any(arg.startswith(("-v", "--volume")) for arg in options)
