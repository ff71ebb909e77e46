"""A stand-in for the upstream registries a recording mirror fetches from (deb.debian.org and
pypi.org), on 127.0.0.1: a Debian pool with one real .deb (built with dpkg-deb) and its
Packages stanza, a suite ``stable`` whose Release (unsigned) names a Sources index of one real
source package (built with dpkg-source), and a PEP 691 simple index with one real wheel. Only
for the tests: the lab reaches the real registries through the host."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from tests.support.loopback_http import serve_on_loopback

# A "~" in the version: apt quotes it in the file's URL (%7e), as Debian's "~deb13u1" are.
DEB_VERSION = "1.0~deb13u1"
DEB_POOL_PATH = f"pool/main/b/bench-extra/bench-extra_{DEB_VERSION}_all.deb"
WHEEL_NAME = "bench_extra-2.0-py3-none-any.whl"
SOURCE_NAME = "bench-src"
SOURCE_POOL = f"pool/main/b/{SOURCE_NAME}"


@dataclass(frozen=True)
class Upstream:
    url: str  # http://127.0.0.1:<port>
    packages: bytes  # the Debian index's stanzas (Filename: pool/...)
    deb: bytes
    wheel: bytes
    sources: dict[str, bytes]  # the suite's index and the source package, by archive path
    requests: list[str]  # every path asked, in order

    @property
    def debian_mirror(self) -> str:
        return f"{self.url}/debian"

    @property
    def python_index(self) -> str:
        return f"{self.url}/simple"


def built_deb(work: Path, name: str, version: str) -> bytes:
    package = work / f"{name}-tree"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "usr" / "share" / name).mkdir(parents=True)
    (package / "usr" / "share" / name / "README").write_text(f"{name} {version}\n")
    (package / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: bench <b@x>\n"
        "Description: a package of the recording test\n"
    )
    deb = work / f"{name}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(package), str(deb)], check=True, capture_output=True)
    return deb.read_bytes()


def built_wheel(version: str = "2.0") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr("bench_extra/__init__.py", f"VALUE = {version!r}\n")
        info = f"bench_extra-{version}.dist-info"
        wheel.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: bench-extra\nVersion: {version}\n"
        )
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return buffer.getvalue()


def _stanza(deb: bytes, work: Path) -> bytes:
    path = work / "probe.deb"
    path.write_bytes(deb)
    control = subprocess.run(
        ["dpkg-deb", "-f", str(path)], capture_output=True, text=True, check=True
    ).stdout.strip()
    return (
        f"{control}\nFilename: {DEB_POOL_PATH}\nSize: {len(deb)}\n"
        f"SHA256: {hashlib.sha256(deb).hexdigest()}\n"
    ).encode()


def built_source_suite(work: Path) -> dict[str, bytes]:
    """A native source package (dpkg-source -b) in the pool, and suite ``stable``'s Sources and
    Release naming it: what ``apt-get source`` asks for, by archive path."""
    tree = work / "source" / f"{SOURCE_NAME}-1.0"
    (tree / "debian" / "source").mkdir(parents=True)
    (tree / "debian" / "source" / "format").write_text("3.0 (native)\n")
    (tree / "debian" / "control").write_text(
        f"Source: {SOURCE_NAME}\nMaintainer: bench <b@x>\n\nPackage: {SOURCE_NAME}\n"
        "Architecture: all\nDescription: a source package of the recording test\n"
    )
    (tree / "debian" / "changelog").write_text(
        f"{SOURCE_NAME} (1.0) unstable; urgency=low\n\n  * Test.\n\n"
        " -- bench <b@x>  Thu, 01 Jan 2026 00:00:00 +0000\n"
    )
    (tree / "debian" / "rules").write_text("#!/usr/bin/make -f\n%:\n\tdh $@\n")
    subprocess.run(["dpkg-source", "-b", tree.name], cwd=tree.parent, check=True,
                   capture_output=True)  # fmt: skip
    pool = work / "source" / "root" / SOURCE_POOL
    pool.mkdir(parents=True)
    for built in tree.parent.glob(f"{SOURCE_NAME}_1.0.*"):
        built.rename(pool / built.name)
    index = subprocess.run(
        ["dpkg-scansources", SOURCE_POOL], cwd=work / "source" / "root", check=True,
        capture_output=True,
    ).stdout  # fmt: skip
    release = (
        "Suite: stable\nCodename: stable\nComponents: main\nArchitectures: all\nSHA256:\n"
        f" {hashlib.sha256(index).hexdigest()} {len(index)} main/source/Sources\n"
    ).encode()
    files = {f"{SOURCE_POOL}/{path.name}": path.read_bytes() for path in pool.iterdir()}
    return {**files, "dists/stable/main/source/Sources": index, "dists/stable/Release": release}


@contextmanager
def upstream_standin(work: Path) -> Iterator[Upstream]:
    deb, wheel = built_deb(work, "bench-extra", DEB_VERSION), built_wheel()
    sources = built_source_suite(work)
    files = {f"/debian/{DEB_POOL_PATH}": deb, f"/files/{WHEEL_NAME}": wheel}
    files |= {f"/debian/{path}": data for path, data in sources.items()}

    def answer(path: str, url: str) -> bytes | None:
        if path == "/simple/bench-extra/":
            return json.dumps({"meta": {"api-version": "1.1"}, "name": "bench-extra", "files": [
                {"filename": WHEEL_NAME, "url": f"{url}/files/{WHEEL_NAME}", "size": len(wheel),
                 "hashes": {"sha256": hashlib.sha256(wheel).hexdigest()}},
            ]}).encode()  # fmt: skip
        return files.get(unquote(path))

    with serve_on_loopback(answer) as served:
        yield Upstream(served.url, _stanza(deb, work), deb, wheel, sources, served.requests)
