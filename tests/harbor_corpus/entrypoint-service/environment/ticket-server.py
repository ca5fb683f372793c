from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

TICKET = Path("/etc/ticket").read_text()


class Tickets(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = self.path == "/ticket"
        body = (TICKET if found else "no such page\n").encode()
        self.send_response(200 if found else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


HTTPServer(("0.0.0.0", 80), Tickets).serve_forever()
