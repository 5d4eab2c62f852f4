"""actfleet's Celery app, built from the `ACTFLEET_*` settings, for Celery's own tools:
`celery -A actfleet.broker.flower_app flower` (and `inspect`, `events`).

Nodes accept msgpack only; Flower started without the app sends JSON control messages,
which nodes refuse (its request to enable task events among them), so it sees no task.
With this app it speaks msgpack on actfleet's transport and queues."""

from __future__ import annotations

from actfleet.broker.celery_app import make_celery
from actfleet.broker.settings import Settings

app = make_celery(Settings.from_env())
