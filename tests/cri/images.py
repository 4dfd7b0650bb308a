"""The test images, built here as an OCI image layout in a tar: nothing is downloaded
(``write_layout`` writes such a tar of any one-layer images).

Both images are one layer of busybox-static (``/bin/busybox`` and a link per
applet): ``PAUSE`` is the pod sandbox image (it sleeps until killed, as
Kubernetes' pause does), ``BUSYBOX`` the workload image. ``ctr images
import`` reads the tar; the image names come from each manifest's
``io.containerd.image.name`` annotation.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from pathlib import Path

from tests.busybox_root import BUSYBOX

PAUSE = "localhost/vcuda-test/pause:1"
BUSYBOX_IMAGE = "localhost/vcuda-test/busybox:1"
_APPLETS = ("sh", "sleep", "cat", "echo", "ls", "grep", "mount", "umount", "rm", "mv", "true",
            "touch", "unshare")
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_IMAGES = {PAUSE: {"Entrypoint": ["/bin/sleep", "2147483647"]}, BUSYBOX_IMAGE: {"Cmd": ["sh"]}}


def write_images(path: Path) -> Path:
    """Write the OCI layout tar of ``PAUSE`` and ``BUSYBOX_IMAGE`` to ``path``; return it."""
    layer = _layer()
    return write_layout(path, {name: (layer, {"Env": ["PATH=/bin"], **config})
                               for name, config in _IMAGES.items()})


def write_layout(path: Path, images: dict[str, tuple[bytes, dict]]) -> Path:
    """Write an OCI layout tar to ``path`` of one image per name, each one layer (a tar) and
    the ``config`` part of its image configuration; return it."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str, **extra: object) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data), **extra}

    platform_ = {"architecture": _ARCH.get(platform.machine(), platform.machine()), "os": "linux"}
    manifests = []
    for name, (layer, config) in images.items():
        image_config = {
            **platform_, "config": config,
            "rootfs": {"type": "layers",
                       "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": _MANIFEST,
            "config": blob(_json(image_config), "application/vnd.oci.image.config.v1+json"),
            "layers": [blob(layer, "application/vnd.oci.image.layer.v1.tar")],
        }
        manifests.append(blob(
            _json(manifest), _MANIFEST, platform=platform_,
            annotations={"io.containerd.image.name": name,
                         "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
        ))
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": manifests}
    with tarfile.open(path, "w") as out:
        add_file(out, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        add_file(out, "index.json", _json(index))
        for digest, data in blobs.items():
            add_file(out, "blobs/sha256/" + digest.split(":", 1)[1], data)
    return path


def directories(out: tarfile.TarFile, names: tuple[str, ...]) -> None:
    """Add directories ``names`` to a layer (``tmp`` world-writable, as images have it)."""
    for directory in names:
        info = tarfile.TarInfo(directory)
        info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
        out.addfile(info)


def _layer() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as out:
        directories(out, ("bin", "etc", "tmp", "proc", "sys", "dev", "run"))
        add_file(out, "bin/busybox", Path(BUSYBOX).read_bytes(), 0o755)
        for applet in _APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            out.addfile(info)
    return buffer.getvalue()


def add_file(out: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    out.addfile(info, io.BytesIO(data))


def _json(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True).encode()
