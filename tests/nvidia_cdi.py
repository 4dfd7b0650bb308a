"""A stand-in for NVIDIA's CDI spec, for the tests that have a runtime apply CDI devices."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path


def write_nvidia_stand_in(directory: Path, uuids: Iterable[str]) -> None:
    """NVIDIA's spec as ``nvidia-ctk cdi generate`` names its devices (by UUID); what it would
    add (device nodes, the driver's libraries) needs a GPU, so an environment line stands in."""
    devices = [{"name": uuid, "containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={uuid}"]}}
               for uuid in uuids]
    (directory / "nvidia.com-gpu.json").write_text(json.dumps(
        {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices}))
