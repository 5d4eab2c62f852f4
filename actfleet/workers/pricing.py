"""The cost of one model response, from genai-prices' maintained price table (the one
pydantic-ai uses). A price that cannot be found is unknown (None), never 0."""

from __future__ import annotations

from genai_prices import calc_price
from pydantic_ai.messages import ModelResponse

from actfleet.broker.model_names import REPLAY_PREFIX


def response_cost(response: ModelResponse, model: str) -> float | None:
    """USD for `response` (a response of actfleet model `model`), or None when unknown: a
    replayed response, usage the provider did not report, or a model or provider the table
    does not price. A cost the provider reported itself (pydantic-ai's gateway) wins.

    The lookup uses the model and provider the response names (a dated model name such as
    `gpt-4o-mini-2024-07-18` matches), trying the provider's URL first, then its name, as
    pydantic-ai does: an OpenAI-compatible server at another URL that answers as `gpt-4o`
    is priced as OpenAI's gpt-4o."""
    if model.startswith(REPLAY_PREFIX):
        return None
    usage = response.usage
    if usage.cost is not None:
        return float(usage.cost)
    if not (usage.input_tokens or usage.output_tokens):
        return None
    name = response.model_name or model.split(":", 1)[-1]
    lookups: list[dict[str, str]] = []
    if response.provider_url:
        lookups.append({"provider_api_url": response.provider_url})
    if response.provider_name:
        lookups.append({"provider_id": response.provider_name})
    for where in lookups:
        try:
            return float(calc_price(usage, name, **where).total_price)  # type: ignore[call-overload]
        except (LookupError, ValueError):
            continue
    return None
