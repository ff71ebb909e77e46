"""How a Pi-family harness is pointed at the proxy: a ``models.json`` and a command line.

Pi (and OMP, its fork) reads custom providers from ``$PI_CODING_AGENT_DIR/models.json``. The
entry names the proxy as base URL and ``$<BEARER_ENV>`` as key, so the file itself holds no
secret: the bearer travels only in the harness process's environment. Pi's own retry settings
go in ``settings.json`` beside it.
"""

from __future__ import annotations

from typing import Any

from runner.lock import Model

BEARER_ENV = "BENCH_PROXY_BEARER"


def pi_models_json(
    model: Model, proxy_base_url: str, bearer_env: str = BEARER_ENV
) -> dict[str, Any]:
    return {
        "providers": {
            model.provider: {
                "baseUrl": proxy_base_url,
                "api": model.api,
                "apiKey": f"${bearer_env}",
                "models": [{"id": model.model, "reasoning": model.thinking != "off"}],
            }
        }
    }


def pi_command(model: Model, prompt: str) -> list[str]:
    """Arguments after the ``pi`` executable: one prompt, JSON event log on stdout, then exit."""
    return [
        "--mode", "json", "-p", "--offline",
        "--provider", model.provider, "--model", model.model, "--thinking", model.thinking,
        prompt,
    ]
