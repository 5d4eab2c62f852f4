"""A scripted local server speaking OpenAI's streaming chat-completions protocol (stdlib only).

Tests point `openai-chat:<model>` at it through `OPENAI_BASE_URL`. Request N of a conversation
(N = the number of assistant messages it carries) gets scripted response N, so a retried or
restarted step gets the same answer. `failures` are answered first, one per request, whatever
the conversation (a provider rate-limiting twice, then answering). Every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Text:
    """A final answer: optional reasoning (`reasoning_content`, as vLLM sends it), then text."""

    content: str
    thinking: str | None = None
    delay: float = 0.0
    """Seconds between streamed pieces (a slow model, for cancelling mid-stream)."""


@dataclass(frozen=True)
class CodeCall:
    """An `execute_ipython_cell` tool call, optionally after some text."""

    code: str
    text: str | None = None


@dataclass(frozen=True)
class ErrorReply:
    """An OpenAI-style error response instead of a stream."""

    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    """Extra response headers, such as Retry-After."""
    code: str | None = None
    """OpenAI's machine-readable error code, such as `insufficient_quota`."""


StubResponse = Text | CodeCall | ErrorReply


@dataclass(frozen=True)
class RecordedRequest:
    """One request the stub received."""

    path: str
    headers: dict[str, str]
    """Header names in lower case."""
    body: dict[str, Any]


class OpenAIStub:
    """The server; use as a context manager, or `start()` and `stop()`."""

    def __init__(
        self,
        responses: Sequence[StubResponse],
        model: str = "stub",
        failures: Sequence[ErrorReply] = (),
    ) -> None:
        self.responses = list(responses)
        self.model = model
        """The model name the stub reports in its chunks (priced by that name)."""
        self.failures = list(failures)
        """Errors for the next requests, one each, before any scripted response."""
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.stub = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """The value for `OPENAI_BASE_URL`."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> OpenAIStub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _record(self, request: RecordedRequest) -> ErrorReply | None:
        """Record a request; the failure it gets, if any are left."""
        with self._lock:
            self.requests.append(request)
            return self.failures.pop(0) if self.failures else None


class _Handler(BaseHTTPRequestHandler):
    server_version = "openai-stub"

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        stub: OpenAIStub = self.server.stub  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        failure = stub._record(
            RecordedRequest(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        )
        if failure is not None:
            return self._error(failure)
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._error(
                ErrorReply(404, f"no route {self.path}; the stub serves /v1/chat/completions")
            )
        if not body.get("stream"):
            return self._error(ErrorReply(400, "the stub only answers streamed requests"))
        messages = body.get("messages", [])
        position = sum(1 for message in messages if message.get("role") == "assistant")
        if position >= len(stub.responses):
            return self._error(
                ErrorReply(
                    400,
                    f"stub script has {len(stub.responses)} responses, asked for {position + 1}",
                )
            )
        response = stub.responses[position]
        if isinstance(response, ErrorReply):
            return self._error(response)

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        deltas = list(_deltas(response, position))
        chunk = {
            "id": f"chatcmpl-stub-{position}",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": stub.model,
        }
        delay = response.delay if isinstance(response, Text) else 0.0
        try:
            for delta in deltas:
                choice = {"index": 0, "delta": delta, "finish_reason": None}
                self._event({**chunk, "choices": [choice]})
                time.sleep(delay)
        except (BrokenPipeError, ConnectionResetError):
            return  # the client went away (a cancelled stream)
        finish = "tool_calls" if isinstance(response, CodeCall) else "stop"
        self._event({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": 10 * len(messages),
                "completion_tokens": len(deltas),
                "total_tokens": 10 * len(messages) + len(deltas),
            }
            self._event({**chunk, "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()

    def _error(self, reply: ErrorReply) -> None:
        error = {"message": reply.message, "type": "invalid_request_error", "code": reply.code}
        data = json.dumps({"error": error}).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        """Quiet: tests read `OpenAIStub.requests` instead."""


def _deltas(response: Text | CodeCall, position: int) -> Iterator[dict[str, Any]]:
    """The `choices[0].delta` objects of one streamed response, word by word."""
    yield {"role": "assistant", "content": ""}
    if isinstance(response, Text) and response.thinking:
        for piece in _pieces(response.thinking):
            yield {"reasoning_content": piece}
    text = response.content if isinstance(response, Text) else response.text
    for piece in _pieces(text or ""):
        yield {"content": piece}
    if isinstance(response, CodeCall):
        call = {"index": 0, "id": f"call_stub_{position}", "type": "function"}
        yield {
            "tool_calls": [{**call, "function": {"name": "execute_ipython_cell", "arguments": ""}}]
        }
        arguments = json.dumps({"code": response.code})
        for start in range(0, len(arguments), 8):
            yield {
                "tool_calls": [
                    {"index": 0, "function": {"arguments": arguments[start : start + 8]}}
                ]
            }


def _pieces(text: str) -> list[str]:
    return re.findall(r"\s+|\S+\s*", text)
