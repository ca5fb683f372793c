import os
import secrets
from http.server import BaseHTTPRequestHandler, HTTPServer

SECRET = secrets.token_hex(12)
STORE: dict[str, bytes] = {}


class KeyValue(BaseHTTPRequestHandler):
    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._answer(200, b"ok\n")
        elif self.path == "/secret":
            self._answer(200, SECRET.encode())
        elif self.path.startswith("/kv/") and self.path[4:] in STORE:
            self._answer(200, STORE[self.path[4:]])
        else:
            self._answer(404, b"no such key\n")

    def do_PUT(self) -> None:
        if not self.path.startswith("/kv/"):
            self._answer(404, b"no such page\n")
            return
        STORE[self.path[4:]] = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(204, b"")

    def log_message(self, *args: object) -> None:
        pass


HTTPServer(("127.0.0.1", int(os.environ["KV_PORT"])), KeyValue).serve_forever()
