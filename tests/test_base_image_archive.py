"""The OCI archive a built base image is packed in (images.base): the same inputs give the same
bytes, and Podman's view of it (manifest digest, image ID) is what runner.core.oci reads."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from images.base import BaseImageInputs, write_oci_archive
from runner.core.canonical import file_digest
from runner.core.oci import read_oci_archive
from runner.spec.base_images import base_recipe


def _inputs(epoch: int = 1764374400) -> BaseImageInputs:
    recipe = base_recipe("python:3.11-slim")
    assert recipe is not None
    return BaseImageInputs(
        recipe=recipe,
        arch="aarch64",
        source_date_epoch=epoch,
        debs=(f"sha256:{'1' * 64}",),
        overlay=f"sha256:{'2' * 64}",
        mirror_url="http://10.0.2.101:80",
        guest_suite="trixie",
    )


def _layer(path: Path) -> Path:
    with tarfile.open(path, "w") as layer:
        data = b"3.11\n"
        info = tarfile.TarInfo("etc/debian_version")
        info.size = len(data)
        layer.addfile(info, io.BytesIO(data))
    return path


def test_the_same_inputs_pack_the_same_archive_bytes(tmp_path: Path) -> None:
    layer = _layer(tmp_path / "rootfs.tar")
    first, second = tmp_path / "a.oci.tar", tmp_path / "b.oci.tar"
    write_oci_archive(_inputs(), layer, first)
    write_oci_archive(_inputs(), layer, second)
    assert file_digest(first) == file_digest(second)
    image = read_oci_archive(first)
    assert (image.os, image.architecture) == ("linux", "arm64")
    # Another epoch is another config, so another image ID and manifest.
    third = tmp_path / "c.oci.tar"
    write_oci_archive(_inputs(epoch=1), layer, third)
    other = read_oci_archive(third)
    assert other.image_id != image.image_id
    assert other.manifest_digest != image.manifest_digest


def test_the_archive_names_the_image_and_holds_the_layer_as_built(tmp_path: Path) -> None:
    layer = _layer(tmp_path / "rootfs.tar")
    archive = tmp_path / "image.oci.tar"
    write_oci_archive(_inputs(), layer, archive)
    with tarfile.open(archive) as packed:
        names = packed.getnames()
        index = packed.extractfile("index.json")
        assert index is not None
        assert b"localhost/bench-base/python-3.11-bookworm:built" in index.read()
    layer_blob = f"blobs/sha256/{file_digest(layer).removeprefix('sha256:')}"
    assert layer_blob in names
    assert names[-2:] == ["index.json", "oci-layout"]
