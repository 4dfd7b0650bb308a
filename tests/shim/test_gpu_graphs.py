"""libvcuda.so on a real GPU: CUDA graphs, stream capture, extra contexts and the one memory
view, with the 4 GiB limit measured from outside (NVML, every process on the GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.shim.gpu_run import LIMIT, Peak, environment, line, started, vcuda_run
from tests.shim.harness import GIB

pytestmark = pytest.mark.gpu

MODES = ["global", "thread", "relaxed"]


def report(name: str, peak: Peak) -> None:
    """Prints the test's outside-measured peak (docs/BENCHMARKS.md collects these lines)."""
    print(f"nvml-peak {name} {peak.bytes} bytes ({peak.bytes / GIB:.3f} GiB)")


def graphs(process: subprocess.Popen[str], count: int) -> tuple[list[dict[str, str]], int]:
    """graph_alloc's lines for count graphs and its "done" figure, once every graph ran."""
    results = []
    for _ in range(count):
        words = line(process)
        assert words[0] == "graph", words
        results.append(dict(word.split("=", 1) for word in words[2:]))
    done = line(process)
    assert done[0] == "done", done
    return results, int(done[1])


def graph_alloc(programs: Path, *words: str) -> list[str]:
    return vcuda_run(str(programs / "gpu" / "graph_alloc"), *words)


@pytest.mark.parametrize("mode", MODES)
def test_captured_graph_allocations_cannot_take_more_than_the_limit(
    programs: Path, mode: str
) -> None:
    with Peak() as peak, started(graph_alloc(programs, "capture", mode, "8", "1024", "keep")) as p:
        results, ok = graphs(p, 8)
    report(f"capture-{mode}-8x1GiB", peak)
    print(results)
    assert 2 <= ok <= 3, "graphs that fit must run, the rest must not"
    for r in results:
        assert (r["launch"], r["check"]) == ("cudaSuccess", "ok") or "MemoryAllocation" in str(r)
    assert peak.bytes <= LIMIT


def test_graph_allocation_nodes_cannot_take_more_than_the_limit(programs: Path) -> None:
    with Peak() as peak, started(graph_alloc(programs, "node", "8", "1024")) as p:
        results, ok = graphs(p, 8)
    report("alloc-node-8x1GiB", peak)
    print(results)
    assert 2 <= ok <= 3
    assert peak.bytes <= LIMIT


@pytest.mark.parametrize("mode", MODES)
def test_graphs_that_fit_run_in_every_capture_mode(programs: Path, mode: str) -> None:
    with Peak() as peak, started(graph_alloc(programs, "capture", mode, "3", "512", "free")) as p:
        results, ok = graphs(p, 3)
    report(f"capture-{mode}-3x512MiB-freed", peak)
    print(results)
    assert ok == 3, results
    assert peak.bytes <= LIMIT


HOLD = """
import sys, torch
block = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
print("allocated", flush=True)
sys.stdin.readline()
"""

CONTEXT = """
import torch
try:
    torch.zeros(1, device="cuda")
    print("context", "admitted", flush=True)
except Exception as exc:
    print("context", "out-of-memory" if "out of memory" in str(exc) else repr(exc), flush=True)
"""


def test_a_context_that_does_not_fit_fails_out_of_memory(programs: Path, tmp_path: Path) -> None:
    account = tmp_path / "account"
    first = vcuda_run(sys.executable, "-c", HOLD, str(3 * GIB), account=account)
    with Peak() as peak, started(first) as p:
        assert line(p) == ["allocated"]
        second = subprocess.run(vcuda_run(sys.executable, "-c", CONTEXT, account=account),
                                env=environment(), capture_output=True, text=True, timeout=120)
    report("second-context-beside-3GiB", peak)
    print(second.stdout, second.stderr[-2000:])
    assert second.stdout.split() == ["context", "out-of-memory"]
    assert peak.bytes <= LIMIT


VIEWS = """
import os, sys, torch, pynvml
block = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
free, total = torch.cuda.mem_get_info()
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
listed = sum(p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
print("views", free, total, v1.free, v1.total, v1.used, v2.free, v2.total, v2.used, listed,
      int(os.getpid() in pids), flush=True)
"""


def test_cuda_and_nvml_give_one_memory_view(programs: Path) -> None:
    result = subprocess.run(vcuda_run(sys.executable, "-c", VIEWS), env=environment(),
                            capture_output=True, text=True, timeout=120)
    print(result.stdout, result.stderr[-2000:])
    words = result.stdout.split()
    assert words[0] == "views"
    free, total, f1, t1, u1, f2, t2, u2, listed, own = map(int, words[1:])
    assert total == t1 == t2 == LIMIT
    assert free == f1 == f2
    assert u1 == u2 == listed == total - free
    assert listed >= GIB and own == 1


TORCH_GRAPH = """
import torch
x = torch.randn(2048, 2048, device="cuda")
w = torch.randn(2048, 2048, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        y = torch.relu(x @ w) + 1
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = torch.relu(x @ w) + 1
    z = y.sum(0)
x.copy_(torch.randn_like(x))
g.replay()
torch.cuda.synchronize()
print("graph", torch.allclose(z, (torch.relu(x @ w) + 1).sum(0), rtol=1e-3, atol=1e-1),
      flush=True)
graphs, error = [], "none"
try:
    while len(graphs) < 8:
        h = torch.cuda.CUDAGraph()
        with torch.cuda.graph(h):
            big = torch.ones(1 << 28, device="cuda")
        h.replay()
        graphs.append((h, big))
except Exception as exc:
    error = "out-of-memory" if "out of memory" in str(exc) else repr(exc)
torch.cuda.synchronize()
print("graphs", len(graphs), error, flush=True)
"""

TORCH_COMPILE = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 512)).cuda()
compiled = torch.compile(model, mode="reduce-overhead")
x = torch.randn(64, 512, device="cuda")
try:
    with torch.no_grad():
        for _ in range(5):
            out = compiled(x).clone()
        print("compiled", torch.allclose(out, model(x), rtol=1e-3, atol=1e-3), flush=True)
except Exception as exc:
    print("compiled", "error", type(exc).__name__, str(exc).split(".")[0][:80], flush=True)
"""

BACKENDS = {"default": "", "async": "backend:cudaMallocAsync"}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_pytorch_cuda_graphs_run_and_stay_within_the_limit(programs: Path, backend: str) -> None:
    with Peak() as peak:
        result = subprocess.run(vcuda_run(sys.executable, "-c", TORCH_GRAPH),
                                env=environment(PYTORCH_CUDA_ALLOC_CONF=BACKENDS[backend]),
                                capture_output=True, text=True, timeout=300)
    report(f"torch.cuda.graph-{backend}", peak)
    print(result.stdout, result.stderr[-3000:])
    lines = [text.split() for text in result.stdout.splitlines()]
    assert lines[0] == ["graph", "True"]
    assert lines[1][0] == "graphs" and lines[1][2] == "out-of-memory"
    assert 1 <= int(lines[1][1]) <= 3
    assert peak.bytes <= LIMIT


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_torch_compile_reduce_overhead_ends_as_it_does_without_the_library(
    programs: Path, backend: str
) -> None:
    def compiled(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, env=environment(PYTORCH_CUDA_ALLOC_CONF=BACKENDS[backend]),
                              capture_output=True, text=True, timeout=240)

    alone = compiled([sys.executable, "-c", TORCH_COMPILE])
    with Peak() as peak:
        limited = compiled(vcuda_run(sys.executable, "-c", TORCH_COMPILE))
    report(f"torch.compile-reduce-overhead-{backend}", peak)
    print(alone.stdout, limited.stdout, limited.stderr[-3000:])
    assert limited.stdout.startswith("compiled")
    assert limited.stdout == alone.stdout
    if backend == "default":
        assert limited.stdout.split() == ["compiled", "True"]
    assert peak.bytes <= LIMIT


IPC = """
import sys, torch, torch.multiprocessing as mp

def child(tensors, sums):
    try:
        sums.put(float(tensors.get().sum()))
    except Exception as exc:
        sums.put("out-of-memory" if "out of memory" in str(exc) else repr(exc))

if __name__ == "__main__":
    mp.set_start_method("spawn")
    tensors, sums = mp.Queue(), mp.Queue()
    process = mp.Process(target=child, args=(tensors, sums))
    process.start()
    block = torch.ones(int(sys.argv[1]) // 4, device="cuda")
    tensors.put(block)
    print("ipc", sums.get(timeout=120), flush=True)
    process.join()
"""


@pytest.mark.parametrize(("size", "fits"), [(GIB, True), (2 * GIB, False)], ids=["1GiB", "2GiB"])
def test_a_cuda_tensor_shared_with_another_process_is_charged_to_both(
    programs: Path, tmp_path: Path, size: int, fits: bool
) -> None:
    script = tmp_path / "share.py"
    script.write_text(IPC)
    with Peak() as peak:
        result = subprocess.run(vcuda_run(sys.executable, str(script), str(size)),
                                env=environment(), capture_output=True, text=True, timeout=240)
    report(f"torch-ipc-{size >> 30}GiB", peak)
    print(result.stdout, result.stderr[-3000:])
    # Two contexts, the tensor and its mapping in the child: 2 GiB do not fit in 4 GiB.
    assert result.stdout.split() == ["ipc", str(float(size // 4)) if fits else "out-of-memory"]
    assert peak.bytes <= LIMIT
