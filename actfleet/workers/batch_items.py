"""A node's part in batches: the batch pumped when one of its items ends or parks for an
approval (a slot frees), and every active batch pumped on each heartbeat (a pump lost to a
crash is made up there). A step's usage is added to its batch by its commit."""

from __future__ import annotations

from actfleet.broker import batches, transitions
from actfleet.broker.records import BadRecord, StepRef
from actfleet.broker.transitions import End, Outcome, Park, text
from actfleet.workers.context import NodeContext


def frees_a_slot(outcome: Outcome) -> bool:
    """An item that ends, or parks for a human, lets another item start."""
    return isinstance(outcome, End) or (isinstance(outcome, Park) and outcome.next == "execution")


async def pump(ctx: NodeContext, batch: str) -> None:
    """Run the batch's transition; send the items it started, cancel the timed-out."""
    pumped = await batches.pump(ctx.keys, ctx.settings, batch).arun(ctx.redis)
    await ctx.send(StepRef.decode(member) for member in pumped.started)
    for session_id in pumped.cancel:
        refs = await transitions.cancel(ctx.keys, ctx.settings, session_id).arun(ctx.redis)
        await ctx.send(refs)


async def pump_all(ctx: NodeContext) -> None:
    """The heartbeat's sweep: pump every batch with items queued or active."""
    for member in await ctx.redis.smembers(ctx.keys.batches_active()):
        try:
            await pump(ctx, text(member))
        except (BadRecord, UnicodeDecodeError) as exc:
            if await ctx.redis.srem(ctx.keys.batches_active(), member):
                await ctx.dead_letter(ctx.keys.batches_active(), member, str(exc))
