"""Signing what a run proved with the lab operator's SSH key (``ssh-keygen -Y sign/verify``).

The key is the operator's, not the run's: one Ed25519 key generated on first use under the host
cache (``<cache>/operator-key/``), so every receipt and archive of the lab is signed by the same
key and a reviewer pins its public half once. OpenSSH's signature format (SSHSIG) is made and
checked by OpenSSH itself; nothing here handles key material beyond naming the file.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import shutil
import socket
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runner.core.errors import InputError, RunnerError
from runner.core.roots import cache_root

NAMESPACE = "frozen-bench-receipt"
SIGNER = "lab-operator"  # the principal in the one-line allowed_signers file, never a key's comment
KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)


@dataclass(frozen=True)
class PublicKey:
    """Exactly one OpenSSH public key: its type and its base64 body (the comment is not part of
    its identity). Parsed strictly, so a file of two keys can never pin one and admit the other."""

    kind: str
    body: str
    comment: str = ""

    @classmethod
    def parse(cls, text: str, where: str) -> PublicKey:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) != 1:
            raise InputError(f"{where}: must be exactly one public key line, found {len(lines)}")
        kind, _, rest = lines[0].strip().partition(" ")
        body, _, comment = rest.strip().partition(" ")
        if kind not in KEY_TYPES:
            raise InputError(f"{where}: {kind[:40]!r} is not an OpenSSH public key type")
        if _blob_type(body) != kind:
            raise InputError(f"{where}: the key's base64 body is not a {kind} key")
        return cls(kind, body, comment.strip())

    @property
    def line(self) -> str:
        """Type and body, without the comment: what a signature is checked against."""
        return f"{self.kind} {self.body}"

    @property
    def fingerprint(self) -> str:
        """OpenSSH's SHA256 fingerprint (``ssh-keygen -lf``'s form)."""
        digest = hashlib.sha256(base64.b64decode(self.body)).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")

    def same_key(self, other: PublicKey) -> bool:
        return self.line == other.line


def fingerprint_of(public_line: str) -> str:
    """The fingerprint of a recorded one-line public key, or why there is none."""
    try:
        return PublicKey.parse(public_line, "signer").fingerprint
    except InputError as error:
        return f"unreadable ({error})"


def _blob_type(body: str) -> str | None:
    """The key type the wire-format blob names in its first field, or None if it is no blob."""
    try:
        blob = base64.b64decode(body, validate=True)
        (length,) = struct.unpack(">I", blob[:4])
        return blob[4 : 4 + length].decode("ascii") if len(blob) > 4 + length else None
    except (binascii.Error, struct.error, UnicodeDecodeError):
        return None


def _ssh_keygen() -> str:
    found = shutil.which("ssh-keygen")
    if found is None:
        raise RunnerError("ssh-keygen not found: install openssh-client to sign or check receipts")
    return found


def _run(arguments: list[str], data: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([_ssh_keygen(), *arguments], input=data, capture_output=True)


@dataclass(frozen=True)
class OperatorKey:
    private: Path

    @classmethod
    def default(cls) -> OperatorKey:
        """The lab operator's key under the cache, generated the first time it is asked for."""
        key = cls(cache_root() / "operator-key" / "id_ed25519")
        if not key.private.exists():
            key.generate()
        return key

    def generate(self) -> None:
        """Under a lock: two runs reporting at once (the e2e tier's two labs) make one key. Its
        comment names the host and the cache it was made in, and its fingerprint, so two
        operators' keys never print alike."""
        self.private.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with (self.private.parent / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.private.exists():
                return
            made = _run(["-q", "-t", "ed25519", "-N", "", "-f", str(self.private)])
            if made.returncode != 0:
                raise RunnerError(f"ssh-keygen could not make {self.private}: {_said(made)}")
            comment = f"frozen-bench operator key, host {socket.gethostname()}, "
            comment += f"cache {self.private.parent.parent}, {self.key.fingerprint}"
            named = _run(["-q", "-c", "-C", comment, "-f", str(self.private)])
            if named.returncode != 0:
                raise RunnerError(f"ssh-keygen could not name {self.private}: {_said(named)}")

    @property
    def public(self) -> str:
        """The public half, one line (``ssh-ed25519 AAAA... <comment>``)."""
        return Path(f"{self.private}.pub").read_text().strip()

    @property
    def key(self) -> PublicKey:
        return PublicKey.parse(self.public, f"{self.private}.pub")

    def sign(self, data: bytes) -> bytes:
        """An armored SSHSIG signature of ``data`` in the receipt namespace."""
        signed = _run(["-Y", "sign", "-q", "-f", str(self.private), "-n", NAMESPACE], data)
        if signed.returncode != 0:
            raise RunnerError(f"ssh-keygen could not sign with {self.private}: {_said(signed)}")
        return signed.stdout


def verify(data: bytes, signature: bytes, public_key: PublicKey) -> str | None:
    """None when ``signature`` is ``public_key``'s signature of ``data`` in the receipt
    namespace; else what ssh-keygen said. The allowed signers file holds that one key only."""
    with tempfile.TemporaryDirectory(prefix="frozen-bench-verify-") as scratch:
        allowed = Path(scratch, "allowed_signers")
        allowed.write_text(f'{SIGNER} namespaces="{NAMESPACE}" {public_key.line}\n')
        signature_file = Path(scratch, "signature")
        signature_file.write_bytes(signature)
        arguments = ["-Y", "verify", "-f", str(allowed), "-I", SIGNER, "-n", NAMESPACE]
        checked = _run([*arguments, "-s", str(signature_file)], data)
    return None if checked.returncode == 0 else _said(checked) or "signature does not verify"


def _said(result: subprocess.CompletedProcess[bytes]) -> str:
    """ssh-keygen's last line of complaint."""
    said = result.stderr.decode(errors="replace").strip().splitlines()
    return said[-1] if said else ""
