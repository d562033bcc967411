"""A small OpenAI-compatible server on loopback: real HTTP, answers chosen by the test."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


def completion(content: str, usage: tuple[int, int] | None = None) -> dict[str, Any]:
    """A ``/chat/completions`` answer; ``usage``: (prompt tokens, completion tokens), as servers report them."""
    body = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    }
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return body


class OpenAIServer:
    """``POST /v1/chat/completions`` (or ``route``) answered by ``respond(body) -> (status, json)``;
    records requests. With ``api_key``, a request without ``Authorization: Bearer <api_key>`` gets a 401."""

    def __init__(self, respond: Responder, route: str = "/v1/chat/completions", api_key: str | None = None):
        self.respond = respond
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, payload = (404, {"error": {"message": "no such route"}})
                if api_key is not None and self.headers.get("Authorization") != f"Bearer {api_key}":
                    status, payload = (401, {"error": {"message": "Incorrect API key provided"}})
                elif self.path == route:
                    status, payload = server.respond(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> OpenAIServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
