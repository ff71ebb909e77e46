"""A real OCI registry on 127.0.0.1 (Debian's docker-registry), and a tiny image pushed to it.

The image is written here as an OCI image layout (one uncompressed layer holding one file, its
config, its manifest) and pushed with skopeo; the registry's manifest digest is what a lock
pins (skopeo compresses the layer on the way, so the registry's manifest is not the layout's).
"""

from __future__ import annotations

import hashlib
import io
import json
import socket
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runner.core.processes import stop_process

_START_SECONDS = 15
_SERVE_SECONDS = 600  # the registry ends by itself should a test session die without a cleanup


@dataclass(frozen=True)
class LoopbackRegistry:
    address: str  # 127.0.0.1:<port>

    def push_tiny_image(self, work: Path, repository: str, arch: str = "arm64") -> str:
        """A one-file image pushed as ``<address>/<repository>:1``; its manifest digest."""
        layout = work / "tiny-layout"
        tiny_image_layout(layout, arch)
        digest_file = work / "pushed.digest"
        subprocess.run(
            [
                "skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false",
                "--digestfile", str(digest_file), f"oci:{layout}:1",
                f"docker://{self.address}/{repository}:1",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        return digest_file.read_text().strip()


@contextmanager
def loopback_registry(work: Path) -> Iterator[LoopbackRegistry]:
    """docker-registry on a free loopback port with its storage under ``work``; killed after."""
    port = _free_port()
    config = work / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {work / 'registry-storage'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log = (work / "registry.log").open("wb")
    process = subprocess.Popen(
        ["timeout", str(_SERVE_SECONDS), "docker-registry", "serve", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_it_answers(port, process)
        yield LoopbackRegistry(f"127.0.0.1:{port}")
    finally:
        stop_process(process, 10)
        log.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_until_it_answers(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"docker-registry exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2):
                return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    raise RuntimeError(f"docker-registry did not answer on 127.0.0.1:{port}")


def tiny_image_layout(layout: Path, arch: str) -> None:
    """An OCI image layout of one image, ref name "1": a layer with /hello.txt, for linux/arch."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes, media_type: str) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        content = b"tiny image\n"
        member = tarfile.TarInfo("hello.txt")
        member.size = len(content)
        archive.addfile(member, io.BytesIO(content))
    layer = buffer.getvalue()
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {"Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [blob(layer, "application/vnd.oci.image.layer.v1.tar")],
    }
    descriptor = blob(json.dumps(manifest).encode(), manifest["mediaType"])  # type: ignore[arg-type]
    index = {
        "schemaVersion": 2,
        "manifests": [{**descriptor, "annotations": {"org.opencontainers.image.ref.name": "1"}}],
    }
    (layout / "index.json").write_text(json.dumps(index))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
