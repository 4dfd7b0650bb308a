"""`vcuda-run`: runs a command under the shim with the limits asked for, or says what is wrong."""

from __future__ import annotations

import _ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_hook import run
from runtime_hook.node_state import process_start_time
from tests.shim.harness import CONTEXT, GIB, LIBRARY, REPO, FakeGpu, fake_uuid


def vcuda_run(*args: str, env: dict[str, str] | None = None, tmp: Path | None = None):
    environment = dict(env if env is not None else os.environ)
    environment["PYTHONPATH"] = str(REPO)
    if tmp is not None:
        environment["TMPDIR"] = str(tmp)
    return subprocess.run(
        [sys.executable, "-m", "runtime_hook.run", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_command_runs_with_the_shim_preloaded_and_a_limits_file(
    shim_build: None, tmp_path: Path
) -> None:
    show = 'cat "$VCUDA_LIMITS_FILE"; echo "preload=$LD_PRELOAD"; echo "pid=$$"'
    result = vcuda_run(
        "--memory", "4Gi", "--cores", "30", "--devices", f"{fake_uuid(0)},{fake_uuid(1)}",
        "--", "sh", "-c", show,
        env=dict(os.environ, LD_PRELOAD="/lib/other.so"), tmp=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    directory = next(tmp_path.glob("vcuda-run-*"))
    assert lines[:5] == [
        "version=1",
        f"memory={4 * GIB}",
        "cores=30",
        f"devices={fake_uuid(0)},{fake_uuid(1)}",
        f"account={directory / 'account'}",
    ]
    assert lines[5] == f"preload={LIBRARY}:/lib/other.so"
    # vcuda-run replaced itself by the command: the directory names the command's pid.
    assert (directory / "owner").read_text().split()[0] == lines[6].split("=")[1]


def test_virtual_memory_reaches_the_programs_it_runs(gpu: FakeGpu) -> None:
    # 9 GiB do not fit on the 8 GiB device: only a limit with 6 GiB in host memory holds them.
    words = ("init", "ctx", "0", "alloc", "9G", "info")
    result = vcuda_run("--memory", "12Gi", "--virtual-memory", "6Gi", "--",
                       *gpu.command(*words), env=gpu.env, tmp=gpu.root)
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines[2][:2] == ["alloc", "CUDA_SUCCESS"]
    assert lines[3] == ["info", "CUDA_SUCCESS", str(3 * GIB - CONTEXT), str(12 * GIB)]


def test_the_limit_reaches_the_programs_it_runs(gpu: FakeGpu) -> None:
    result = vcuda_run(
        "--memory", "3Gi", "--", *gpu.command("init", "total", "0"), env=gpu.env, tmp=gpu.root
    )
    assert result.stdout.splitlines()[1] == f"total CUDA_SUCCESS {3 * GIB}"


def test_commands_given_one_account_share_the_memory(gpu: FakeGpu) -> None:
    account = str(gpu.root / "team.acct")
    holder = subprocess.Popen(
        [sys.executable, "-m", "runtime_hook.run", "--memory", "4Gi", "--account", account, "--",
         *gpu.command("init", "ctx", "0", "alloc", "3G", "wait")],
        env=dict(gpu.env, PYTHONPATH=str(REPO), TMPDIR=str(gpu.root)),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None
        while holder.stdout.readline().strip() != "waiting":
            pass
        args = ("--memory", "4Gi", "--account", account, "--")
        second = vcuda_run(*args, *gpu.command("init", "ctx", "0", "alloc", "3G"), env=gpu.env)
        assert second.stdout.splitlines()[2] == "alloc CUDA_ERROR_OUT_OF_MEMORY"
    finally:
        holder.kill()
        holder.wait()


def test_the_devices_option_limits_those_devices_and_refuses_the_others(
    two_gpus: FakeGpu,
) -> None:
    words = two_gpus.command("init", "total", "0", "total", "1")
    result = vcuda_run("--memory", "1Gi", "--devices", fake_uuid(1), "--", *words, env=two_gpus.env)
    assert result.stdout.splitlines()[1:] == [
        "total CUDA_SUCCESS 0",
        f"total CUDA_SUCCESS {GIB}",
    ]


@pytest.mark.parametrize(
    ("size", "expected"),
    [("4Gi", 4 * GIB), ("512Mi", 512 << 20), ("1.5Gi", 3 * GIB // 2), ("2G", 2 * 10**9),
     ("1000", 1000), ("8k", 8000)],
)
def test_sizes_are_read_as_kubernetes_writes_them(size: str, expected: int) -> None:
    assert run.parse_size(size) == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory", "4Gb", "--", "true"], "bad size '4Gb': write a number of bytes"),
        (["--memory", "-1", "--", "true"], "bad size '-1'"),
        (["--memory", "0", "--", "true"], "less than one byte"),
        (["--memory", "0.5", "--", "true"], "less than one byte"),
        (["--memory", "", "--", "true"], "bad size ''"),
        (["--memory", "4Gi", "--cores", "0", "--", "true"], "cores must be 1..100, got 0"),
        (["--memory", "4Gi", "--cores", "150", "--", "true"], "cores must be 1..100, got 150"),
        (["--memory", "4Gi", "--cores", "x", "--", "true"], "invalid int value: 'x'"),
        (["--memory", "4Gi", "--cores", "nan", "--", "true"], "invalid int value: 'nan'"),
        (["--memory", "nan", "--", "true"], "bad size 'nan'"),
        (["--memory", "inf", "--", "true"], "bad size 'inf'"),
        (["--memory", "4Gi", "--devices", "GPU a", "--", "true"],
         "'GPU a' is not a GPU or MIG UUID"),
        (["--memory", "4Gi", "--devices", "GPU-typo", "--", "true"],
         "--devices: 'GPU-typo' is not a GPU or MIG UUID: write them as 'nvidia-smi -L' prints"),
        (["--memory", "4Gi", "--devices", f"{fake_uuid(0)},0", "--", "true"],
         "'0' is not a GPU or MIG UUID"),
        (["--memory", "4Gi", "--virtual-memory", "4Gi", "--", "true"],
         "virtual-memory must be less than memory (4294967296), got 4294967296"),
        (["--memory", "4Gi", "--virtual-memory", "2GB", "--", "true"], "bad size '2GB'"),
        (["--memory", "4Gi", "--virtual-memory", "-1", "--", "true"], "bad size '-1'"),
        (["--memory", "4Gi", "--"], "no command given: write it after '--'"),
        (["--memory", "4Gi"], "no command given"),
        (["--", "true"], "the following arguments are required: --memory"),
        (["--memory", "4Gi", "--library", "/nope/libvcuda.so", "--", "true"],
         "--library /nope/libvcuda.so: no such file"),
        (["--memory", "4Gi", "--library", "/etc/passwd", "--", "true"],
         "--library /etc/passwd: does not load as a library (/etc/passwd: invalid ELF header)"),
        (["--memory", "4Gi", "--library", _ctypes.__file__, "--", "true"],
         "exports no cuMemAlloc_v2: it is not libvcuda.so"),
    ],
)
def test_bad_command_lines_get_a_clear_error_and_run_nothing(
    shim_build: None, tmp_path: Path, args: list[str], message: str
) -> None:
    result = vcuda_run(*args, tmp=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""
    assert list(tmp_path.glob("vcuda-run-*")) == []


def test_a_missing_library_says_where_it_looked_and_how_to_build_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run, "_library_candidates", lambda: ["/nowhere/libvcuda.so"])
    with pytest.raises(SystemExit) as exited:
        run.main(["--memory", "4Gi", "--", "true"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "libvcuda.so not found (looked at /nowhere/libvcuda.so)" in error
    assert "make -C cshim" in error


@pytest.mark.parametrize("uuid", [
    "GPU-5c3d1a2b-0c1d-4e5f-8a9b-0c1d2e3f4a5b",
    "GPU-5C3D1A2B-0C1D-4E5F-8A9B-0C1D2E3F4A5B",
    "MIG-5c3d1a2b-0c1d-4e5f-8a9b-0c1d2e3f4a5b",
    "MIG-GPU-5c3d1a2b-0c1d-4e5f-8a9b-0c1d2e3f4a5b/1/0",
])
def test_devices_are_taken_as_nvidia_smi_prints_them(uuid: str) -> None:
    assert run.parse_devices(f" {uuid} ,") == (uuid,)


def test_the_library_is_looked_for_where_the_node_installer_puts_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(run.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(run, "__file__", str(tmp_path / "runtime_hook" / "run.py"))  # no build
    candidates = run._library_candidates()
    assert candidates[1] == "/usr/local/vcuda/lib/libvcuda.so"  # after this checkout's build


def test_a_command_that_does_not_exist_fails_with_127_and_leaves_nothing(
    shim_build: None, tmp_path: Path
) -> None:
    result = vcuda_run("--memory", "4Gi", "--", "no-such-command-here", tmp=tmp_path)
    assert result.returncode == 127
    assert "vcuda-run: no-such-command-here: command not found" in result.stderr
    assert list(tmp_path.glob("vcuda-run-*")) == []


def test_directories_of_ended_commands_are_swept_and_live_ones_kept(
    shim_build: None, tmp_path: Path
) -> None:
    ended, live = tmp_path / "vcuda-run-ended", tmp_path / "vcuda-run-live"
    me = f"{os.getpid()} {process_start_time(os.getpid())}"
    for directory, owner in ((ended, "999999999 1"), (live, me)):
        directory.mkdir()
        (directory / "owner").write_text(owner)
    assert vcuda_run("--memory", "1Gi", "--", "true", tmp=tmp_path).returncode == 0
    assert not ended.exists()
    assert live.exists()


def test_help_explains_sizes_and_sharing() -> None:
    result = vcuda_run("--help")
    assert result.returncode == 0
    assert "Ki, Mi, Gi, Ti (powers of" in result.stdout
    assert "--account" in result.stdout


def test_the_limits_variable_comes_first_in_the_commands_environment(
    shim_build: None, tmp_path: Path
) -> None:
    """Where the node agent reads it in /proc/<pid>/environ, whatever else is set."""
    first = r'tr "\0" "\n" < /proc/$$/environ | head -n 1'
    result = vcuda_run("--memory", "1Gi", "--", "sh", "-c", first, tmp=tmp_path,
                       env=dict(os.environ, VCUDA_LIMITS_FILE="/elsewhere", A_LONG="x" * 5000))
    assert result.returncode == 0, result.stderr
    directory = next(tmp_path.glob("vcuda-run-*"))
    assert result.stdout == f"VCUDA_LIMITS_FILE={directory / 'limits'}\n"
