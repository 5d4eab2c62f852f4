"""`actfleet dashboard`: the fleet, sessions, live session pages, batches and approvals in a
browser (Starlette, server-sent events, server-rendered HTML with htmx; no build step)."""
