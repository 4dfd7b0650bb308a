"""A small CUDA program the demo runs under vcuda-run: the memory it sees, and past it.

It asks PyTorch (else CuPy) for the GPU's free and total memory, keeps 60% of
the total, asks for another 60%, and prints what happened. Its last line is
``RESULT {json}`` for the demo to check. Standard library plus torch or cupy:
it runs on whatever Python has them, not vcuda's environment.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, NamedTuple

NO_CUDA_LIBRARY = 3  # exit status when neither torch nor cupy is importable
SHARE = 0.6
GIB = 1 << 30


class _Library(NamedTuple):
    name: str
    mem_get_info: Callable[[], tuple[int, int]]  # (free, total) bytes
    allocate: Callable[[int], Any]  # that many bytes on the GPU
    fill: Callable[[Any], None]  # write every byte of an allocation, and wait
    out_of_memory: type[BaseException]


def _torch() -> _Library | None:
    try:
        import torch
    except ImportError:
        return None

    def fill(array: Any) -> None:
        array.fill_(1)
        torch.cuda.synchronize()

    return _Library(f"torch {torch.__version__}", torch.cuda.mem_get_info,
                    lambda size: torch.empty(size, dtype=torch.uint8, device="cuda"), fill,
                    torch.cuda.OutOfMemoryError)


def _cupy() -> _Library | None:
    try:
        import cupy
    except ImportError:
        return None

    def fill(array: Any) -> None:
        array.fill(1)
        cupy.cuda.Device().synchronize()

    return _Library(f"cupy {cupy.__version__}", cupy.cuda.runtime.memGetInfo,
                    lambda size: cupy.empty(size, dtype=cupy.uint8), fill,
                    cupy.cuda.memory.OutOfMemoryError)


def main() -> int:
    cuda = _torch() or _cupy()
    if cuda is None:
        print("neither torch nor cupy can be imported by this Python", file=sys.stderr)
        return NO_CUDA_LIBRARY
    free, total = cuda.mem_get_info()
    print(f"{cuda.name}: mem_get_info() says {free / GIB:.2f} GiB free of {total / GIB:.2f} GiB")
    size = int(total * SHARE)
    kept = cuda.allocate(size)
    print(f"allocated {size / GIB:.2f} GiB: fine")
    error = ""
    try:
        cuda.allocate(size)
    except cuda.out_of_memory as exc:
        error = str(exc).splitlines()[0]
        print(f"allocating {size / GIB:.2f} GiB more: {type(exc).__name__}: {error}")
    else:
        print(f"allocating {size / GIB:.2f} GiB more: it worked, past the limit")
    cuda.fill(kept)
    print(f"the program goes on: its first {size / GIB:.2f} GiB is still usable")
    print("RESULT " + json.dumps({"library": cuda.name, "free": free, "total": total,
                                  "out_of_memory": bool(error), "error": error}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
