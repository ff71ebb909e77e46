"""Signing what a run proved with the lab operator's SSH key (``ssh-keygen -Y sign/verify``).

The key is the operator's, not the run's: one Ed25519 key generated on first use under the host
cache (``<cache>/operator-key/``), so every receipt and archive of the lab is signed by the same
key and a reviewer pins its public half once. OpenSSH's signature format (SSHSIG) is made and
checked by OpenSSH itself; nothing here handles key material beyond naming the file.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runner.core.errors import RunnerError
from runner.core.roots import cache_root

NAMESPACE = "frozen-bench-receipt"
SIGNER = "lab-operator"


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
        """Under a lock: two runs reporting at once (the e2e tier's two labs) make one key."""
        self.private.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with (self.private.parent / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.private.exists():
                return
            made = _run(["-q", "-t", "ed25519", "-N", "", "-C", SIGNER, "-f", str(self.private)])
            if made.returncode != 0:
                raise RunnerError(f"ssh-keygen could not make {self.private}: {_said(made)}")

    @property
    def public(self) -> str:
        """The public half, one line (``ssh-ed25519 AAAA... lab-operator``)."""
        return Path(f"{self.private}.pub").read_text().strip()

    def sign(self, data: bytes) -> bytes:
        """An armored SSHSIG signature of ``data`` in the receipt namespace."""
        signed = _run(["-Y", "sign", "-q", "-f", str(self.private), "-n", NAMESPACE], data)
        if signed.returncode != 0:
            raise RunnerError(f"ssh-keygen could not sign with {self.private}: {_said(signed)}")
        return signed.stdout


def verify(data: bytes, signature: bytes, public_key: str) -> str | None:
    """None when ``signature`` is ``public_key``'s signature of ``data`` in the receipt
    namespace; else what ssh-keygen said."""
    with tempfile.TemporaryDirectory(prefix="frozen-bench-verify-") as scratch:
        allowed = Path(scratch, "allowed_signers")
        allowed.write_text(f'{SIGNER} namespaces="{NAMESPACE}" {public_key}\n')
        signature_file = Path(scratch, "signature")
        signature_file.write_bytes(signature)
        arguments = ["-Y", "verify", "-f", str(allowed), "-I", SIGNER, "-n", NAMESPACE]
        checked = _run([*arguments, "-s", str(signature_file)], data)
    return None if checked.returncode == 0 else _said(checked) or "signature does not verify"


def _said(result: subprocess.CompletedProcess[bytes]) -> str:
    """ssh-keygen's last line of complaint."""
    said = result.stderr.decode(errors="replace").strip().splitlines()
    return said[-1] if said else ""
