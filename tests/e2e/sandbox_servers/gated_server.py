"""Runs inside a sandbox: echo_server.py's server, plus GET /gate: a chunked answer whose
second part is written only once /tmp/gate-open exists, so a client reads the first part
only if nothing on the way holds an answer back until it ends."""
import os
import socketserver
import sys
import time
from http.server import ThreadingHTTPServer

import echo_server

GATE = "/tmp/gate-open"


class Handler(echo_server.Handler):
    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        if not self.path.startswith("/gate"):
            return super().do_GET()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.chunk(b'{"part": 1}\n')
        while not os.path.exists(GATE):
            time.sleep(0.02)
        self.chunk(b'{"part": 2}\n')
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


if __name__ == "__main__":
    socketserver.TCPServer.allow_reuse_address = True
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
