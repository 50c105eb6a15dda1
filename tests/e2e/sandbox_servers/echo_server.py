"""Runs inside a sandbox: an HTTP server that echoes requests, streams SSE, and speaks
WebSocket (stdlib only)."""
import base64
import hashlib
import json
import socketserver
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def echo(self):
        length = int(self.headers.get("Content-Length") or 0)
        digest, size = hashlib.sha256(), 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                n = int(self.rfile.readline().strip(), 16)
                if n == 0:
                    self.rfile.readline()
                    break
                chunk = self.rfile.read(n)
                self.rfile.readline()
                digest.update(chunk)
                size += len(chunk)
        else:
            while size < length:
                chunk = self.rfile.read(min(1 << 20, length - size))
                if not chunk:
                    break
                digest.update(chunk)
                size += len(chunk)
        self.reply(200, {"method": self.command, "path": self.path,
                         "headers": {k.lower(): v for k, v in self.headers.items()},
                         "body_size": size, "body_sha256": digest.hexdigest()})

    def do_GET(self):
        if self.path.startswith("/sse"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for i in range(5):
                self.wfile.write(f"data: {i} {time.time():.6f}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.3)
            self.close_connection = True
            return
        if self.path.startswith("/ws"):
            key = self.headers.get("Sec-WebSocket-Key", "")
            accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.end_headers()
            self.wfile.flush()
            self.websocket_echo()
            self.close_connection = True
            return
        self.echo()

    do_POST = do_PUT = do_DELETE = do_PATCH = echo

    def websocket_echo(self):
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack("!H", self.rfile.read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if opcode == 8:
                self.wfile.write(b"\x88\x00")
                return
            reply = b"echo: " + data
            if len(reply) < 126:
                frame = bytes([0x80 | opcode, len(reply)])
            else:
                frame = bytes([0x80 | opcode, 126]) + struct.pack("!H", len(reply))
            self.wfile.write(frame + reply)
            self.wfile.flush()


if __name__ == "__main__":
    socketserver.TCPServer.allow_reuse_address = True
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
