"""How a Pi-family harness is pointed at the proxy: a models file and a command line.

Pi and OMP (its fork) both read custom providers from the directory in ``PI_CODING_AGENT_DIR``:
Pi from ``models.json``, OMP from ``models.yml`` (JSON is valid YAML). The entry names the proxy
as base URL and refers to the bearer by the NAME of an environment variable, so the file holds
no secret: the bearer travels only in the harness process's environment. The two differ in how
a key refers to a variable: Pi wants ``$NAME``, OMP the bare ``NAME``.
"""

from __future__ import annotations

from typing import Any, Literal

from runner.spec.lock import Model

BEARER_ENV = "BENCH_PROXY_BEARER"

Agent = Literal["pi", "omp"]

# agent -> (models file in PI_CODING_AGENT_DIR, how a key names an environment variable)
_MODELS_FILES: dict[Agent, tuple[str, str]] = {
    "pi": ("models.json", "${}"),
    "omp": ("models.yml", "{}"),
}


def models_file_name(agent: Agent) -> str:
    return _MODELS_FILES[agent][0]


def models_config(
    agent: Agent, model: Model, proxy_base_url: str, bearer_env: str = BEARER_ENV
) -> dict[str, Any]:
    """The models file's content: one provider, the lock's model, reached through the proxy."""
    key_reference = _MODELS_FILES[agent][1].format(bearer_env)
    return {
        "providers": {
            model.provider: {
                "baseUrl": proxy_base_url,
                "api": model.api,
                "apiKey": key_reference,
                "models": [{"id": model.model, "reasoning": model.thinking != "off"}],
            }
        }
    }


def agent_command(model: Model, prompt: str) -> list[str]:
    """Arguments after the ``pi``/``omp`` executable: one prompt, JSON events on stdout, exit."""
    return [
        "--mode",
        "json",
        "-p",
        "--provider",
        model.provider,
        "--model",
        model.model,
        "--thinking",
        model.thinking,
        prompt,
    ]
