"""SWE-bench rows with `image_name`: the docker commands an episode would run (clusters; not run here).

SWE-bench's images hold the repository at /testbed, with its Python environment in the conda env
`testbed`. An episode copies /testbed out of the image into a fresh host workspace once
(`export_commands`), then runs every command as a one-shot container of the image with that
workspace bound at /testbed (`episode_command`): the sandbox's docker isolation (no network, read-only
root, no capabilities, uid 65534, memory/pids/file-size/CPU limits: envs/agentic/sandbox.py
`docker_command`). Grading would run the same steps as envs/swe/grading.py in a second fresh copy.
Only the argument lists are built and pinned by tests here: no docker daemon is available on this
machine, so none of these commands has been run.
"""
from __future__ import annotations

from pathlib import Path

from envs.agentic.sandbox import SYSTEM_PATH, SandboxLimits, docker_command
from envs.swe.tasks import SweTask, TaskFormatError

TESTBED = "/testbed"  # where SWE-bench's images hold the repository
TESTBED_PATH = f"/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:{SYSTEM_PATH}"  # their python first


def _image(task: SweTask) -> str:
    if not task.image_name:
        raise TaskFormatError(f"instance {task.instance_id!r}: no 'image_name': it runs in a local sandbox")
    return task.image_name


def export_commands(task: SweTask, workspace: Path, name: str) -> list[list[str]]:
    """The commands that copy the image's /testbed into `workspace` (a container created, copied from, removed)."""
    image = _image(task)
    return [["docker", "create", "--name", name, "--network", "none", image, "true"],
            ["docker", "cp", f"{name}:{TESTBED}/.", str(Path(workspace).resolve())],
            ["docker", "rm", "--force", name]]


def episode_command(task: SweTask, workspace: Path, command: str, limits: SandboxLimits | None = None,
                    name: str | None = None) -> list[str]:
    """`docker run` for one command of an episode: the image, the workspace at /testbed, the sandbox's limits."""
    return docker_command(_image(task), workspace, command, limits, name=name, target=TESTBED,
                          env={"PATH": TESTBED_PATH})
