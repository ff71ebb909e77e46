"""``runner check-archive FILE``: verify a run's archive offline; one verdict, exit 1 if broken,
2 if some outcome could not be re-judged (unless accepted)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from runner.archive.check import ArchiveBroken, check_archive
from runner.core.errors import InputError, RunnerError, terminal_safe
from runner.report.signing import PublicKey

# The archive holds together, but some outcomes stand on the operator's word alone.
NOT_REJUDGED_EXIT = 2


@click.command("check-archive")
@click.argument(
    "archive", metavar="FILE", type=click.Path(path_type=Path, dir_okay=False, exists=True)
)
@click.option(
    "--key",
    "key_file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="the operator's public key as published: one line, the only key the signatures may "
    "verify with",
)
@click.option(
    "--trust-signer-in-archive",
    is_flag=True,
    help="without --key: accept whatever key the archive carries (any forger's key passes; "
    "the verdict says UNPINNED)",
)
@click.option(
    "--accept-digest-only",
    is_flag=True,
    help="exit 0 although some outcomes could not be re-judged (their trial kept by digest "
    "only, or unjudged without a freeze manifest): they are still named",
)
def check_archive_command(
    archive: Path, key_file: Path | None, trust_signer_in_archive: bool, accept_digest_only: bool
) -> None:
    """Check the signatures, the ledger's chain, every digest, every outcome against its trial,
    the credential scan, and that the receipt and report recompute from the run's files."""
    if key_file is None and not trust_signer_in_archive:
        raise click.UsageError(
            "the signer is unpinned: give --key OPERATOR.pub (the key as published), or "
            "--trust-signer-in-archive to accept the archive's own key"
        )
    if key_file is None:
        click.echo("signer UNPINNED: the archive's own key is trusted (--trust-signer-in-archive)")
    try:
        pinned = (
            None if key_file is None else PublicKey.parse(key_file.read_text(), f"--key {key_file}")
        )
    except InputError as error:
        raise click.UsageError(str(error)) from None
    except UnicodeDecodeError:
        raise click.UsageError(f"--key {key_file}: not a text file") from None
    try:
        verdict = check_archive(archive, pinned)
    except ArchiveBroken as broken:
        click.echo(f"archive BROKEN: {terminal_safe(str(broken))}")
        sys.exit(broken.exit_code)
    except RunnerError:
        raise  # this machine's problem (no ssh-keygen, say), not the archive's
    except Exception as error:  # input no link foresaw: still a verdict line, never a traceback
        said = terminal_safe(f"{type(error).__name__}: {error}")
        click.echo(f"archive BROKEN: the check stopped on what it read ({said})")
        sys.exit(ArchiveBroken.exit_code)
    for line in verdict.lines(accept_digest_only):
        click.echo(terminal_safe(line))
    if verdict.not_rejudged and not accept_digest_only:
        sys.exit(NOT_REJUDGED_EXIT)
