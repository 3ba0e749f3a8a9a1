"""A real HTTP proxy in front of the test S3 server that answers every ``every``-th request with
503 SlowDown (what S3 sends when a prefix is throttled) and forwards the rest unchanged (headers
included, so SigV4 signatures stay valid)."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class SlowDownProxy:
    def __init__(self, upstream_port: int, every: int = 3):
        self.refused = 0
        self.forwarded = 0
        self._count = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy._lock:
                    proxy._count += 1
                    refuse = proxy._count % every == 0
                    proxy.refused += refuse
                    proxy.forwarded += not refuse
                if refuse:
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.send_header("Connection", "close")
                    self.close_connection = True
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                head = self.command == "HEAD"
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection") and (head or k.lower() != "content-length"):
                        self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")  # one request per connection: nothing pooled goes stale
                self.close_connection = True
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # the client opens many connections at once

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> SlowDownProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
