"""``python -m runner.provider SCRIPT.json --port N``: the scripted provider on its own.

The key is read from the environment variable named by ``--key-env``; the process serves until
it is stopped. Used by bench/proxy_load.py so the provider does not share the proxy's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from runner.core.errors import RunnerError
from runner.core.files import read_model
from runner.provider.script import ProviderScript
from runner.provider.server import ScriptedProvider


async def _serve(provider: ScriptedProvider, port: int) -> None:
    base_url = await provider.start(port)
    print(base_url, flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m runner.provider")
    parser.add_argument("script", type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--key-env", default="SCRIPTED_PROVIDER_KEY")
    args = parser.parse_args()
    try:
        script = read_model(args.script, ProviderScript)
        key = os.environ.get(args.key_env)
        if not key:
            raise RunnerError(f"environment variable {args.key_env} is not set")
    except RunnerError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    asyncio.run(_serve(ScriptedProvider(key, script), args.port))


if __name__ == "__main__":
    main()
