"""Per-call cgroups: finding a cgroup v2 subtree the service may use (against a directory laid out
as cgroupfs is; the machines here have a hybrid hierarchy without v2 controllers, so the kernel's
side cannot run here), and the runner's gate, for real: the call's processes start only once they
are in their cgroup, and never when entering it failed."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from antwort_grpc.tool_services.sandbox import SandboxSettings
from antwort_grpc.tool_services.sandbox.cgroup import HELPER_BYTES, HELPER_PROCESSES, CallCgroups, delegate, own_cgroup
from antwort_grpc.tool_services.sandbox.limits import Limits
from antwort_grpc.tool_services.sandbox.service import prepare_runner

PYTHON = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable
SERVICE_PID = 4242


def cgroupfs(root: Path, own: str, controllers: str = "cpu memory pids", procs: str = f"{SERVICE_PID}\n") -> Path:
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    directory = root / own.lstrip("/")
    directory.mkdir(parents=True)
    (directory / "cgroup.controllers").write_text(controllers + "\n")
    (directory / "cgroup.procs").write_text(procs)
    return directory


def test_the_own_cgroup_is_the_unified_line_of_proc_self_cgroup() -> None:
    assert own_cgroup("12:memory:/x\n0::/kubepods/pod1/ctr\n") == "/kubepods/pod1/ctr"
    assert own_cgroup("4:memory:/x\n") is None


def test_without_a_cgroup_v2_hierarchy_there_is_no_delegation(tmp_path: Path) -> None:
    assert delegate(tmp_path, "/", SERVICE_PID) == f"no cgroup v2 hierarchy at {tmp_path}"


def test_controllers_not_delegated_to_the_service_mean_no_delegation(tmp_path: Path) -> None:
    cgroupfs(tmp_path, "/pod/ctr", controllers="cpu")
    assert "memory, pids are not delegated" in str(delegate(tmp_path, "/pod/ctr", SERVICE_PID))


def test_a_cgroup_shared_with_other_processes_is_left_alone(tmp_path: Path) -> None:
    cgroupfs(tmp_path, "/pod/ctr", procs=f"1\n{SERVICE_PID}\n")
    assert "other processes share" in str(delegate(tmp_path, "/pod/ctr", SERVICE_PID))


def test_a_delegated_cgroup_gets_a_leaf_for_the_service_and_a_subtree_for_the_calls(tmp_path: Path) -> None:
    own = cgroupfs(tmp_path, "/pod/ctr")
    cgroups = delegate(tmp_path, "/pod/ctr", SERVICE_PID)
    assert cgroups == CallCgroups(own / "calls")
    assert (own / "service" / "cgroup.procs").read_text() == str(SERVICE_PID)
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (own / "calls" / "cgroup.subtree_control").read_text() == "+memory +pids"
    call = cgroups.create("antwort-sandbox-abc", 512 * 1024 * 1024, 64)
    assert (call / "memory.max").read_text() == str(512 * 1024 * 1024 + HELPER_BYTES)
    assert (call / "memory.swap.max").read_text() == "0"
    assert (call / "pids.max").read_text() == str(64 + HELPER_PROCESSES)
    (call / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert CallCgroups.oom_killed(call)


# The gate, with a stand-in for cgroupfs (a directory of plain files).


@dataclasses.dataclass(frozen=True, slots=True)
class FileCgroups(CallCgroups):
    fail_to_enter: bool = False

    def create(self, name: str, memory_bytes: int, processes: int) -> Path:
        path = self.parent / name
        path.mkdir()
        return path

    def enter(self, path: Path, pid: int) -> None:  # type: ignore[override]
        if self.fail_to_enter:
            raise PermissionError("cgroup.procs: Permission denied")
        # What the kernel would move: the gate's process, still waiting (no code has run yet).
        (path / "entered").write_text(str(pid))

    @staticmethod
    def remove(path: Path) -> None:
        shutil.rmtree(path)


@pytest.fixture
def roots() -> Iterator[tuple[Path, Path]]:
    workdirs, cgroups = Path(tempfile.mkdtemp(prefix="antwort-cg-work-")), Path(tempfile.mkdtemp(prefix="antwort-cg-"))
    workdirs.chmod(0o755)
    yield workdirs, cgroups
    shutil.rmtree(workdirs)
    shutil.rmtree(cgroups)


@pytest.mark.parametrize("namespaces", ["auto", "off"])
async def test_the_call_starts_only_once_it_is_in_its_cgroup(namespaces: str, roots: tuple[Path, Path]) -> None:
    workdirs, parent = roots
    settings = SandboxSettings(python=PYTHON, namespaces=namespaces, workdir_root=str(workdirs))
    runner = await prepare_runner(settings, Limits.from_settings(settings))
    runner.cgroups = FileCgroups(parent)
    seen: list[str] = []

    def remember(message: str) -> None:
        if message == "started":
            seen.extend(p.read_text() for p in parent.glob("*/entered"))

    outcome = await runner.run("print('inside')", remember)
    assert (outcome.exit_code, outcome.stdout.text()) == (0, "inside\n")
    assert len(seen) == 1  # by "started" the child was in its cgroup (the code waits for that)
    assert list(parent.iterdir()) == []  # removed after the call


async def test_a_call_that_cannot_enter_its_cgroup_never_runs(roots: tuple[Path, Path]) -> None:
    workdirs, parent = roots
    settings = SandboxSettings(python=PYTHON, workdir_root=str(workdirs))
    runner = await prepare_runner(settings, Limits.from_settings(settings))
    runner.cgroups = FileCgroups(parent, fail_to_enter=True)
    outcome = await runner.run("open('ran', 'w')\nprint('ran')", lambda _: None)
    assert outcome.stdout.text() == "" and outcome.setup_error is not None
    assert list(parent.iterdir()) == []
