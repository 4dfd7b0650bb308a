"""The limits file that the hook and `vcuda-run` write and `libvcuda.so` reads.

This module is the one place where the Python side renders the format; the C
parser in `cshim/` reads the same lines and `cshim/README.md` documents them.
Standard library only: the hook imports it on every container start.

Format: UTF-8 text, one ``key=value`` per line, no spaces around ``=``, lines
starting with ``#`` ignored, unknown keys ignored by the shim (forward
compatible), each key at most once.

    version=1
    memory=10737418240          # bytes allowed on each listed device
    cores=30                    # percent of each device's time, 1..100
    devices=GPU-5c3d...,GPU-... # UUIDs the limits apply to (empty: all visible)
    account=/run/vcuda/account  # shared account file of all processes
"""

from __future__ import annotations

from runtime_hook.record import Record

FORMAT_VERSION = 1
CONTAINER_PATH = "/etc/vcuda/limits"
MAX_LINE = 4096


class LimitsFormatError(ValueError):
    """The text is not a valid limits file; the message says which line and why."""


# A Record, not a dataclass or a named tuple: importing dataclasses (9 ms) or
# collections (2 ms) would cost the hook that much on every limited container start.
class Limits(Record):
    """What one container (or one `vcuda-run` command) may use on each device.

    ``memory`` in bytes, ``cores`` in percent, ``devices`` GPU UUIDs, ``account`` a path.
    """

    _fields = ("memory", "cores", "devices", "account")
    __slots__ = _fields

    def __init__(
        self, memory: int, cores: int = 100, devices: tuple[str, ...] = (), account: str = ""
    ) -> None:
        super().__init__(memory, cores, tuple(devices), account)
        self._check()

    def _check(self) -> None:
        if self.memory <= 0:
            raise LimitsFormatError(f"memory must be a positive number of bytes, got {self.memory}")
        if not 1 <= self.cores <= 100:
            raise LimitsFormatError(f"cores must be 1..100, got {self.cores}")
        for uuid in self.devices:
            if not uuid or any(c in uuid for c in ",=\n\r\t #"):
                raise LimitsFormatError(f"device UUID {uuid!r} holds a character not allowed")
        if any(c in self.account for c in "\n\r\0"):
            raise LimitsFormatError("account path holds a line break or NUL")


def render(limits: Limits) -> str:
    """Return the file text for ``limits``."""
    lines = [
        f"version={FORMAT_VERSION}",
        f"memory={limits.memory}",
        f"cores={limits.cores}",
        f"devices={','.join(limits.devices)}",
    ]
    if limits.account:
        lines.append(f"account={limits.account}")
    return "\n".join(lines) + "\n"


def parse(text: str) -> Limits:
    """Parse file text as the shim does; raise LimitsFormatError on anything it would reject."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        if len(line) > MAX_LINE or "=" not in line:
            raise LimitsFormatError(f"line {number}: expected key=value")
        key, value = line.split("=", 1)
        if key in values:
            raise LimitsFormatError(f"line {number}: {key} given twice")
        values[key] = value
    if values.get("version") != str(FORMAT_VERSION):
        raise LimitsFormatError(f"version must be {FORMAT_VERSION}")
    try:
        memory = int(values["memory"])
        cores = int(values.get("cores", "100"))
    except KeyError as exc:
        raise LimitsFormatError(f"{exc.args[0]} is missing") from None
    except ValueError:
        raise LimitsFormatError("memory and cores must be whole numbers") from None
    devices = tuple(d for d in values.get("devices", "").split(",") if d)
    return Limits(memory=memory, cores=cores, devices=devices, account=values.get("account", ""))
