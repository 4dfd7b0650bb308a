"""libvcuda.so on a real GPU, with a 4 GiB limit: frameworks, plain CUDA, nvidia-smi, sharing."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shim.gpu_run import (
    LIMIT,
    TORCH_FILL,
    environment,
    line,
    process_memory,
    started,
    vcuda_run,
)
from tests.shim.harness import BUILD, GIB, MIB, TESTS

pytestmark = pytest.mark.gpu

BLOCK = 256 * MIB

CUPY_FILL = """
import sys, cupy
free, total = cupy.cuda.runtime.memGetInfo()
print("info", free, total, flush=True)
held, error = [], "none"
try:
    while len(held) < 64:
        held.append(cupy.empty(256 << 20, dtype=cupy.uint8))
except Exception as exc:
    error = type(exc).__name__
print("filled", len(held), error, flush=True)
sys.stdin.readline()
"""

JAX_COMPUTE = """
import sys, jax, jax.numpy as jnp, numpy as np
a = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)
product = np.asarray(jnp.dot(a, a, precision=jax.lax.Precision.HIGHEST))
stats = jax.devices()[0].memory_stats()
print("jax", stats["bytes_limit"], bool(np.allclose(product, a @ a, rtol=1e-4)), flush=True)
sys.stdin.readline()
"""

TORCH_HOLD = """
import sys, torch
size = int(sys.argv[1])
while True:
    try:
        block = torch.empty(size, dtype=torch.uint8, device="cuda")
        print("allocated", flush=True)
    except torch.OutOfMemoryError:
        print("out-of-memory", flush=True)
    if not sys.stdin.readline():
        break
"""


def check_fill(process: subprocess.Popen[str]) -> None:
    """A fill reports the limit, ends in out-of-memory within [3.25, 4] GiB, holds <= 4 GiB."""
    info, filled = line(process), line(process)
    held = process_memory(process.pid)
    print(f"{info} {filled} driver-held={held}")
    assert info[0] == "info" and int(info[2]) == LIMIT
    assert filled[0] == "filled" and filled[2] == "OutOfMemoryError"
    assert 3.25 * GIB <= int(filled[1]) * BLOCK <= LIMIT
    assert held <= LIMIT


@pytest.mark.parametrize(
    "allocator", ["", "expandable_segments:True", "backend:cudaMallocAsync"], ids=["default",
    "expandable", "async"]
)
def test_pytorch_sees_4_gib_and_runs_out_of_memory_within_it(
    programs: Path, allocator: str
) -> None:
    with started(vcuda_run(sys.executable, "-c", TORCH_FILL),
                 PYTORCH_CUDA_ALLOC_CONF=allocator) as process:
        check_fill(process)


def test_cupy_sees_4_gib_and_runs_out_of_memory_within_it(programs: Path) -> None:
    with started(vcuda_run(sys.executable, "-c", CUPY_FILL)) as process:
        check_fill(process)


def test_jax_preallocates_its_fraction_of_4_gib_and_computes_correctly(programs: Path) -> None:
    with started(vcuda_run(sys.executable, "-c", JAX_COMPUTE)) as process:
        result = line(process)
        held = process_memory(process.pid)
        print(f"{result} driver-held={held}")
        assert result[0] == "jax" and result[2] == "True"
        assert 0.6 * LIMIT <= int(result[1]) <= 0.75 * LIMIT
        assert held <= LIMIT


def test_a_plain_cuda_program_with_static_cudart_gets_the_same_limit(programs: Path) -> None:
    result = subprocess.run(
        vcuda_run(str(BUILD / "gpu" / "cuda_fill")),
        env=environment(), capture_output=True, text=True, timeout=120, check=True,
    )
    print(result.stdout, result.stderr)
    info, filled = (text.split() for text in result.stdout.splitlines())
    assert info[:2] == ["info", "cudaSuccess"] and int(info[3]) == LIMIT
    assert filled[2] == "cudaErrorMemoryAllocation"
    assert 3.25 * GIB <= int(filled[1]) * BLOCK <= LIMIT


def test_nvidia_smi_shows_4096_mib_total(programs: Path) -> None:
    query = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    result = subprocess.run(vcuda_run(*query), env=environment(), capture_output=True,
                            text=True, timeout=120, check=True)
    table = subprocess.run(vcuda_run("nvidia-smi"), env=environment(), capture_output=True,
                           text=True, timeout=120, check=True)
    print(result.stdout, table.stdout)
    assert result.stdout.split() == ["4096"]
    assert "4096MiB" in table.stdout


def test_two_processes_share_one_account_and_a_killed_one_stops_counting(
    programs: Path, tmp_path: Path
) -> None:
    # 2 GiB each: both contexts fit in 4 GiB (a context that does not fit is refused,
    # test_gpu_graphs.py), the second 2 GiB does not.
    account = tmp_path / "account"
    first_command = vcuda_run(sys.executable, "-c", TORCH_HOLD, str(2 * GIB), account=account)
    with started(first_command) as first:
        assert line(first) == ["allocated"]
        with started(vcuda_run(sys.executable, "-c", TORCH_HOLD, str(2 * GIB),
                               account=account)) as second:
            assert line(second) == ["out-of-memory"]
            first.send_signal(signal.SIGKILL)
            first.wait()
            assert second.stdin is not None
            second.stdin.write("\n")
            second.stdin.flush()
            assert line(second) == ["allocated"]


def probe(*words: str, mode: str = "link", cores: int = 100) -> list[str]:
    """The probe under the 4 GiB limit on the real driver."""
    return vcuda_run(str(TESTS / "probe"), mode, *words, cores=cores)


@pytest.mark.parametrize(
    "path",
    [
        ("alloc", "512M"),
        ("managed", "512M"),
        ("pitch", "65536", "8192"),
        ("array", "16384", "8192"),
        ("array3d", "1024", "1024", "128"),
        ("mipmap", "8192", "8192", "2"),
        ("vmm", "512M", "0"),
        ("async", "512M"),
        ("pool", "512M"),
    ],
    ids=lambda path: path[0],
)
@pytest.mark.parametrize("mode", ["link", "getproc"])
def test_every_allocation_path_stops_at_the_limit_on_the_real_driver(
    programs: Path, path: tuple[str, ...], mode: str
) -> None:
    words = probe("init", "ctx", "0", "fillwith", *path, "info", "wait", mode=mode)
    with started(words) as process:
        lines = [line(process) for _ in range(5)]
        held = process_memory(process.pid)
    print(lines, f"driver-held={held}")
    assert lines[4] == ["waiting"]
    filled, info = lines[2], lines[3]
    assert filled[0] == "fillwith" and filled[2] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert int(filled[1]) >= 4, "the path was not usable up to the limit"
    assert info[1] == "CUDA_SUCCESS" and int(info[3]) == LIMIT
    # Charged up to the limit: what is left is less than one more block.
    assert int(info[2]) < 512 * MIB
    assert held <= LIMIT


@pytest.mark.parametrize("mode", ["getproc", "link"])
def test_the_real_drivers_entry_points_map_to_wrappers_version_for_version(
    programs: Path, tmp_path: Path, mode: str
) -> None:
    def resolved(shim: bool) -> dict[tuple[str, ...], list[str]]:
        # A core limit: kernel launches are wrapped too.
        command = (probe("resolve", mode=mode, cores=50) if shim
                   else [str(TESTS / "probe"), mode, "resolve"])
        out = subprocess.run(command, env=environment(), capture_output=True, text=True,
                             timeout=120, check=True).stdout
        return {tuple(w[1:4]): w[4:] for w in (text.split() for text in out.splitlines())}

    wrapped = {
        text.split()[1]
        for text in subprocess.run([str(TESTS / "probe"), "link", "wrapped"], capture_output=True,
                                   text=True, check=True).stdout.splitlines()
    }
    driver, shimmed = resolved(False), resolved(True)
    mismatches = []
    for key, (result, library, symbol) in driver.items():
        expected = [result, "libvcuda.so" if symbol in wrapped else library, symbol]
        if shimmed.get(key) != expected:
            mismatches.append((key, driver[key], shimmed.get(key)))
    print(f"{len(driver)} answers compared; mismatches: {mismatches[:20]}")
    assert not mismatches
    # The driver answers with its exported entry points (else the map above could not
    # apply): the newest version of every intercepted name comes back wrapped.
    newest = str(max(int(key[1]) for key in driver))
    bases = {key[0] for key, answer in driver.items() if answer[2] in wrapped}
    unwrapped = {
        key: (driver[key], answer)
        for key, answer in shimmed.items()
        if key[0] in bases and key[1] == newest and answer[0] == "CUDA_SUCCESS"
        and answer[1] != "libvcuda.so"
    }
    print(f"newest version {newest}: not wrapped: {unwrapped}")
    assert not unwrapped


def test_vmm_memory_released_while_mapped_stays_charged_on_the_real_driver(
    programs: Path,
) -> None:
    # Released right after mapping, as the CUDA samples do: the driver keeps the memory while
    # it is mapped, and so does the account.
    words = probe("init", "ctx", "0", "vmm", "2G", "0", "vmmmap", "0", "2G", "free", "0",
                  "alloc", "2G", "free", "1", "alloc", "2G", "wait")
    with started(words) as process:
        lines = [line(process) for _ in range(9)]
        held = process_memory(process.pid)
    print(lines, f"driver-held={held}")
    assert [words[:2] for words in lines[2:5]] == [
        ["vmm", "CUDA_SUCCESS"], ["vmmmap", "CUDA_SUCCESS"], ["free", "CUDA_SUCCESS"]]
    assert lines[5] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"], "released but mapped: still held"
    assert lines[6] == ["free", "CUDA_SUCCESS"]
    assert lines[7][:2] == ["alloc", "CUDA_SUCCESS"], "unmapped: given back"
    assert held <= LIMIT


def test_memory_imported_from_another_process_counts_against_the_limit_on_the_real_driver(
    programs: Path,
) -> None:
    # An unlimited process exports 3 GiB as a POSIX file descriptor; a process under the
    # 4 GiB limit takes the descriptor (pidfd_getfd), imports and maps it.
    exporter_words = [str(TESTS / "probe"), "link", "init", "ctx", "0", "vmmfd", "3G", "0",
                      "vmmexport", "0", "wait"]
    with started(exporter_words) as exporter:
        exported = [line(exporter) for _ in range(5)]
        assert exported[3][:2] == ["vmmexport", "CUDA_SUCCESS"] and exported[4] == ["waiting"]
        pid, fd = exported[3][2:]
        words = probe("init", "ctx", "0", "info", "vmmimport", pid, fd, "vmmmap", "0", "3G",
                      "info", "alloc", "1G", "free", "1", "free", "0", "info", "alloc", "1G",
                      "wait")
        with started(words) as importer:
            lines = [line(importer) for _ in range(12)]
            held = process_memory(importer.pid)
    print(exported, lines, f"driver-held={held}")

    def used(info: list[str]) -> int:
        assert info[:2] == ["info", "CUDA_SUCCESS"] and int(info[3]) == LIMIT
        return LIMIT - int(info[2])

    assert lines[3][:2] == ["vmmimport", "CUDA_SUCCESS"]
    assert lines[4][:2] == ["vmmmap", "CUDA_SUCCESS"]
    assert used(lines[5]) - used(lines[2]) == 3 * GIB, "the mapping is charged to the importer"
    assert lines[6] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert lines[7:9] == [["free", "CUDA_SUCCESS"], ["free", "CUDA_SUCCESS"]]
    assert used(lines[9]) == used(lines[2]), "unmapped and released: given back"
    assert lines[10][:2] == ["alloc", "CUDA_SUCCESS"]
    assert held <= LIMIT
