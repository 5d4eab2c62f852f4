"""Budgets: checked before each model step; once one is reached no model step starts and
the turn ends as TurnFinished `budget` (a running step finishes, so a budget can be passed
by at most one step, and by subagents running at the time)."""

from __future__ import annotations

from actfleet.broker.records import TurnRecord
from actfleet.broker.transitions import text
from actfleet.workers.context import NodeContext


async def budget_reached(ctx: NodeContext, turn: TurnRecord) -> str | None:
    """Why the turn may start no more model steps (one line, for the turn's record), or None.

    Per turn: the submission's `max_tokens` (input + output, subagents included) and
    `max_cost` (USD of the steps with a known price: steps of an unpriced model count 0
    here, so a cost budget does not bound them). `ctx` is for budgets kept in Redis beyond
    the turn (a batch's)."""
    max_tokens = turn.options.get("max_tokens")
    used = turn.input_tokens + turn.output_tokens
    if max_tokens is not None and used >= max_tokens:
        return f"token budget reached: {used:,} tokens used, --max-tokens {max_tokens:,}"
    max_cost = turn.options.get("max_cost")
    if max_cost is not None and turn.cost >= max_cost:
        return f"cost budget reached: ${turn.cost:.4f} spent, --max-cost {max_cost:g}"
    return await batch_budget_reached(ctx, turn.batch) if turn.batch else None


async def batch_budget_reached(ctx: NodeContext, batch: str) -> str | None:
    """Why the batch's items may start no more model steps: its budget is spent (checked
    here, not only by the batch's pump, so no step starts between the spending and the
    next pump), or the pump found it so."""
    fields = ("status", "max_cost", "max_tokens", "cost", "input_tokens", "output_tokens")
    raw = await ctx.redis.hmget(ctx.keys.batch(batch), *fields)
    status, max_cost, max_tokens, cost, tokens_in, tokens_out = (text(v or b"0") for v in raw)
    try:
        used, spent = int(tokens_in) + int(tokens_out), float(cost)
        over_tokens = int(max_tokens) > 0 and used >= int(max_tokens)
        over_cost = float(max_cost) > 0 and spent >= float(max_cost)
    except ValueError:
        return None
    if status == "budget" or over_tokens or over_cost:
        return (
            f"batch {batch} budget reached: {used:,} tokens and ${spent:.4f} spent "
            f"(--max-tokens {max_tokens}, --max-cost {max_cost})"
        )
    return None
