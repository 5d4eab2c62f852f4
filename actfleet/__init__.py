"""actfleet: CodeAct agents as distributed work on Redis and Celery."""

__version__ = "0.1.0"
