"""The wire: everything that crosses Redis. Imports neither pydantic-ai nor jupyter_client."""
