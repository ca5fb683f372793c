"""An MCP server over streamable HTTP (POST /mcp, JSON answers; the standard library only) with one tool,
sign_guestbook; GET /guestbook lists the names signed, for the test. It speaks HTTP/1.0, one request per
connection; its one argument, when given, is how many seconds it keeps a connection open after answering before
closing it (a slow close, as a busy machine makes one)."""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUESTBOOK: list[str] = []
LINGER_S = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
TOOL = {
    "name": "sign_guestbook",
    "description": "Sign the guestbook with a name.",
    "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
}


def answer(message):
    method, params = message.get("method"), message.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "guestbook", "version": "1.0"},
        }
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call" and params.get("name") == "sign_guestbook":
        name = str((params.get("arguments") or {}).get("name", ""))
        GUESTBOOK.append(name)
        return {"content": [{"type": "text", "text": f"signed by {name} (entry {len(GUESTBOOK)})"}]}
    if method == "ping":
        return {}
    raise LookupError(method)


class Handler(BaseHTTPRequestHandler):
    def handle(self):
        super().handle()
        time.sleep(LINGER_S)

    def _send(self, status, body=b"", kind="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b"ok\n", "text/plain")
        elif self.path == "/guestbook":
            self._send(200, "".join(f"{name}\n" for name in GUESTBOOK).encode(), "text/plain")
        else:
            self._send(405)

    def do_POST(self):
        if self.path != "/mcp":
            self._send(404)
            return
        message = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if "id" not in message:
            self._send(202)
            return
        try:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
        except LookupError as error:
            reply = {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": f"no {error}"}}
        self._send(200, json.dumps(reply).encode())

    def do_DELETE(self):
        self._send(200)


ThreadingHTTPServer(("127.0.0.1", 8000), Handler).serve_forever()
