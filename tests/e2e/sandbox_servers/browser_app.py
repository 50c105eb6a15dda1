"""Runs inside a sandbox: a page whose script is loaded by absolute path (/static/app.js), as
Streamlit's or Jupyter's are, and a log of the headers of every request it got, one JSON
line each, in LOG (stdlib only)."""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = "/tmp/browser_app.log"

PAGE = b"""<!doctype html>
<html><head><title>cove app</title></head>
<body><div id="out">the script did not run</div>
<script src="/static/app.js"></script></body></html>
"""
SCRIPT = b"""document.getElementById("out").textContent = "app.js ran on " + location.host;
document.title = "cove app: script ran";
"""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        with open(LOG, "a") as f:
            f.write(json.dumps({"path": self.path,
                                "headers": [[k.lower(), v] for k, v in self.headers.items()]}) + "\n")
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            body, ctype, status = PAGE, "text/html; charset=utf-8", 200
        elif path == "/static/app.js":
            body, ctype, status = SCRIPT, "text/javascript", 200
        elif path == "/set-cookie":
            # an app trying to replace coved's cookie (and setting one of its own)
            body, ctype, status = b"{}", "application/json", 200
        else:
            body, ctype, status = b"not found", "text/plain", 404
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if path == "/set-cookie":
            self.send_header("Set-Cookie", "cove_route=from-the-app; Path=/")
            self.send_header("Set-Cookie", "app_session=1; Path=/")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_GET


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
