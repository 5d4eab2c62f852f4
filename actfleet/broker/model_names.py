"""Client-side check of a model string, so a typo fails at submit time rather than on a worker.

No pydantic-ai import: the client must stay light. The provider names below are copied from
pydantic-ai-slim 2.68.0: the providers `pydantic_ai.providers.infer_provider_class` knows that
`pydantic_ai.models.infer_model` turns into a chat model (so not `elevenlabs`,
`sentence-transformers` or `voyageai`), and the upstreams of `pydantic_ai.providers.gateway`.
"""

from __future__ import annotations

REPLAY_PREFIX = "replay:"
BARE_MODELS = ("test",)
"""Model strings pydantic-ai resolves without a provider (`test`: its TestModel)."""

MODEL_PROVIDERS: tuple[str, ...] = (
    # The common ones first: they lead the list in error messages.
    "openai-chat",
    "openai",
    "anthropic",
    "google",
    "google-cloud",
    "bedrock",
    "groq",
    "mistral",
    "ollama",
    "vllm",
    "openrouter",
    "deepseek",
    "xai",
    "alibaba",
    "azure",
    "azure-responses",
    "bedrock-mantle",
    "cerebras",
    "cohere",
    "crusoe",
    "fireworks",
    "github",
    "github-copilot",
    "google-decisions",
    "heroku",
    "huggingface",
    "litellm",
    "meta",
    "moonshotai",
    "nebius",
    "openai-chatgpt",
    "openai-codex",
    "openai-decisions",
    "openai-responses",
    "ovhcloud",
    "sambanova",
    "snowflake",
    "system-one",
    "together",
    "typesafe",
    "vercel",
    "zai",
)
"""Providers of `provider:model` strings, as pydantic-ai-slim 2.68.0 resolves them."""

GATEWAY_UPSTREAMS: tuple[str, ...] = (
    "openai",
    "openai-chat",
    "openai-responses",
    "chat",
    "responses",
    "groq",
    "anthropic",
    "bedrock",
    "converse",
    "google",
    "google-cloud",
)
"""Upstreams of `gateway/<upstream>:model` (Pydantic AI Gateway) in pydantic-ai-slim 2.68.0."""

_SHOWN = 6


class ModelNameError(ValueError):
    """A model string no worker could resolve; the message says what to write instead."""


def check_model_name(name: str) -> None:
    """Raise `ModelNameError` unless `name` is `replay:<file>`, a known `provider:model`
    or `test`."""
    if name in BARE_MODELS:
        return
    hint = f"use one of {', '.join(MODEL_PROVIDERS[:_SHOWN])}, ... or {REPLAY_PREFIX}<file>"
    if name.startswith(REPLAY_PREFIX):
        if not name[len(REPLAY_PREFIX) :].strip():
            raise ModelNameError(f"model {name!r} names no file; write {REPLAY_PREFIX}<file>")
        return
    provider, sep, model = name.partition(":")
    if not sep:
        raise ModelNameError(
            f"model {name!r} has no provider; write provider:model (e.g. openai-chat:{name}); "
            + hint
        )
    if provider.startswith("gateway/"):
        upstream = provider.removeprefix("gateway/")
        if upstream not in GATEWAY_UPSTREAMS:
            raise ModelNameError(
                f"unknown gateway upstream {upstream!r} in {name!r}; "
                f"use gateway/<one of {', '.join(GATEWAY_UPSTREAMS)}>:<model>"
            )
    elif provider not in MODEL_PROVIDERS:
        raise ModelNameError(f"unknown model provider {provider!r} in {name!r}; {hint}")
    if not model.strip():
        raise ModelNameError(
            f"model {name!r} names no model after the provider; write {provider}:<model>"
        )
