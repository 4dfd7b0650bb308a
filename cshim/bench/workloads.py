"""PyTorch workloads of the compute-share benchmark (scripts/bench-workloads), one process.

Runs each named workload in turn: builds it, warms it up, then counts its steps
over a measured interval, and prints one JSON line per workload:
{"workload", "steps", "seconds", "rate" (steps a second), "start", "end"
(time.time() of the measured interval)}. With --start-at, warm-up lasts until
that moment (time.time()), so processes started together measure the same
interval. With --turns (one workload), it warms up, prints {"ready": name},
then runs for the seconds each line of stdin gives, one measurement each
(scripts/bench-under-share). With --pace-windows MS, under the diagnostic
library that paces only every other MS window of CLOCK_MONOTONIC (make -C
cshim diag), it notes when each step ends and prints {"workload", "paced",
"unpaced" (the rates of the whole windows of each kind, each without its first
--settle ms), "start", "end"} (scripts/bench-paced-windows).

- train: a GPT-2-small-sized training step (12 layers, 768 wide, 12 heads,
  vocabulary 50257), batch 8 x 512 tokens, bf16 autocast, fused attention,
  AdamW with foreach kernels; the loss read back each step, as a training loop
  logs it.
- decode: batch-1 autoregressive decoding of a small transformer (8 layers,
  512 wide, 8 heads, static KV cache of 512 positions), greedy, each token read
  back as a server streams it: launch-bound, the GPU idles between kernels.
- decode-graph: the same decoding step captured once as a CUDA graph
  (torch.cuda.graph) and replayed a token at a time.
- matmul: bf16 8192^3 torch.matmul back to back (read back every 16).
- elementwise: x.mul_() on 4M floats from a Python loop (read back every 1000).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

Step = Callable[[], None]


def train_step() -> Step:
    torch.manual_seed(0)
    layers, width, heads, vocab, batch, length = 12, 768, 12, 50257, 8, 512
    size = width // heads
    embed = torch.nn.Embedding(vocab, width)
    blocks = torch.nn.ModuleList(torch.nn.ModuleDict({
        "norm1": torch.nn.LayerNorm(width), "qkv": torch.nn.Linear(width, 3 * width),
        "out": torch.nn.Linear(width, width), "norm2": torch.nn.LayerNorm(width),
        "up": torch.nn.Linear(width, 4 * width), "down": torch.nn.Linear(4 * width, width),
    }) for _ in range(layers))
    model = torch.nn.ModuleList([embed, torch.nn.Embedding(length, width), blocks,
                                 torch.nn.LayerNorm(width)]).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tokens = torch.randint(0, vocab, (batch, length + 1), device="cuda")
    positions = torch.arange(length, device="cuda")

    def forward() -> torch.Tensor:
        x = embed(tokens[:, :-1]) + model[1](positions)
        for b in blocks:
            q, k, v = b["qkv"](b["norm1"](x)).view(batch, length, 3, heads, size).permute(
                2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + b["out"](a.transpose(1, 2).reshape(batch, length, width))
            x = x + b["down"](F.gelu(b["up"](b["norm2"](x))))
        logits = model[3](x) @ embed.weight.t()
        return F.cross_entropy(logits.float().view(-1, vocab), tokens[:, 1:].reshape(-1))

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()

    return step


class Decoder:
    """A small transformer decoding one token at a time into a static KV cache: every
    tensor keeps its shape, so a step can be captured as a CUDA graph."""

    def __init__(self, layers: int = 8, width: int = 512, heads: int = 8, vocab: int = 32000,
                 positions: int = 512) -> None:
        torch.manual_seed(0)
        options = {"device": "cuda", "dtype": torch.bfloat16}
        scale = 1 / math.sqrt(width)
        self.heads, self.width, self.positions = heads, width, positions
        self.embed = torch.randn(vocab, width, **options) * scale
        self.layers = [
            {name: torch.randn(*shape, **options) * scale for name, shape in
             (("qkv", (width, 3 * width)), ("out", (width, width)),
              ("up", (width, 4 * width)), ("down", (4 * width, width)))}
            for _ in range(layers)]
        self.keys = torch.zeros(layers, heads, positions, width // heads, **options)
        self.values = torch.zeros_like(self.keys)
        self.token = torch.zeros(1, dtype=torch.long, device="cuda")
        self.position = torch.zeros(1, dtype=torch.long, device="cuda")
        self.every = torch.arange(positions, device="cuda")

    def step(self) -> None:
        """Decodes the next token in place: the token and the position move on."""
        x = self.embed[self.token]
        visible = (self.every <= self.position).view(1, 1, 1, -1)
        size = self.width // self.heads
        for i, w in enumerate(self.layers):
            h = F.layer_norm(x, (self.width,))
            q, k, v = (h @ w["qkv"]).view(3, self.heads, 1, size).unbind(0)
            self.keys[i].index_copy_(1, self.position, k)
            self.values[i].index_copy_(1, self.position, v)
            a = F.scaled_dot_product_attention(q[None], self.keys[i][None], self.values[i][None],
                                               attn_mask=visible)
            x = x + a.reshape(1, self.width) @ w["out"]
            x = x + F.gelu(F.layer_norm(x, (self.width,)) @ w["up"]) @ w["down"]
        logits = F.layer_norm(x, (self.width,)) @ self.embed.t()
        self.token.copy_(logits.argmax(-1))
        self.position.add_(1).remainder_(self.positions)


def decode_step() -> Step:
    decoder = Decoder()

    def step() -> None:
        decoder.step()
        decoder.token.item()

    return step


def decode_graph_step() -> Step:
    decoder = Decoder()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            decoder.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decoder.step()

    def step() -> None:
        graph.replay()
        decoder.token.item()

    return step


def batched(launch: Callable[[], None], every: int) -> Step:
    """A step of `every` launches, then a read-back: at most that many queued."""

    def step() -> None:
        for _ in range(every):
            launch()
        torch.cuda.synchronize()

    return step


def matmul_step() -> Step:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    return batched(lambda: torch.matmul(a, b, out=c), 16)


def elementwise_step() -> Step:
    x = torch.ones(4 << 20, device="cuda")
    return batched(lambda: x.mul_(1.0000001), 1000)


WORKLOADS: dict[str, tuple[Callable[[], Step], int]] = {
    # name: (builder, launches a step, for rates in launches where a step is a batch)
    "train": (train_step, 1),
    "decode": (decode_step, 1),
    "decode-graph": (decode_graph_step, 1),
    "matmul": (matmul_step, 16),
    "elementwise": (elementwise_step, 1000),
}


def warmed(name: str, warmup: float, start_at: float | None) -> Step:
    """Workload name's step, built and run for warmup seconds (or until start_at)."""
    step = WORKLOADS[name][0]()
    torch.cuda.synchronize()
    until = max(time.time() + warmup, start_at or 0.0)
    while time.time() < until:
        step()
    torch.cuda.synchronize()
    return step


def timed(name: str, step: Step, seconds: float) -> dict:
    """Runs step for seconds: the measurement printed for it."""
    per_step = WORKLOADS[name][1]
    steps, start = 0, time.time()
    while time.time() - start < seconds:
        step()
        steps += 1
    torch.cuda.synchronize()
    end = time.time()
    return {"workload": name, "steps": steps * per_step, "seconds": end - start,
            "rate": steps * per_step / (end - start), "start": start, "end": end}


def take_turns(name: str, warmup: float) -> None:
    """Warms workload name up, prints {"ready": name}, then runs it for the seconds each line
    of stdin gives, printing a measurement after each, until stdin ends. Between its turns
    it waits with nothing queued on the GPU, so another process can take the device."""
    step = warmed(name, warmup, None)
    print(json.dumps({"ready": name}), flush=True)
    for line in sys.stdin:
        print(json.dumps(timed(name, step, float(line))), flush=True)


def paced_windows(name: str, step: Step, seconds: float, window_ms: float,
                  settle_ms: float) -> dict:
    """Runs step for seconds, noting when each step ends on CLOCK_MONOTONIC, the clock of the
    diagnostic library's windows: the rate of each whole window after its first settle_ms
    (while the library's threads read what the window before left them), by whether the
    library paced its launches (odd windows) or not (even ones)."""
    window, settle = round(window_ms * 1e6), round(settle_ms * 1e6)
    ends: list[int] = []
    start, began = time.time(), time.monotonic_ns()
    while time.monotonic_ns() - began < seconds * 1e9:
        step()
        ends.append(time.monotonic_ns())
    end = time.time()
    first, last = began // window + 1, ends[-1] // window   # the whole windows
    counts = dict.fromkeys(range(first, last), 0)
    for t in ends:
        if t // window in counts and t % window >= settle:
            counts[t // window] += 1
    counted = (window - settle) / 1e9
    rates: dict[str, list[float]] = {"paced": [], "unpaced": []}
    for i, steps in counts.items():
        rates["paced" if i % 2 else "unpaced"].append(steps * WORKLOADS[name][1] / counted)
    return {"workload": name, **rates, "start": start, "end": end}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds (default 1.5)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured (default 3)")
    parser.add_argument("--start-at", type=float, help="warm up until this time.time()")
    parser.add_argument("--turns", action="store_true",
                        help="one workload, run for the seconds each line of stdin gives")
    parser.add_argument("--pace-windows", type=float, metavar="MS",
                        help="rates of paced and unpaced windows of MS milliseconds (the "
                             "diagnostic library, VCUDA_PACE_WINDOW_MS=MS)")
    parser.add_argument("--settle", type=float, default=150.0, metavar="MS",
                        help="with --pace-windows, the start of each window not counted "
                             "(default 150)")
    args = parser.parse_args()
    names = args.workloads.split(",")
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload {', '.join(unknown)}: choose from {', '.join(WORKLOADS)}")
    if args.turns:
        if len(names) != 1:
            parser.error("--turns takes one workload")
        take_turns(names[0], args.warmup)
        return
    if args.pace_windows is not None and not 0 <= args.settle < args.pace_windows:
        parser.error("--settle must be at least 0 and less than --pace-windows")
    for name in names:
        step = warmed(name, args.warmup, args.start_at)
        measured = (paced_windows(name, step, args.seconds, args.pace_windows, args.settle)
                    if args.pace_windows is not None else timed(name, step, args.seconds))
        print(json.dumps(measured), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
