#!/usr/bin/env python3
"""A static file server for flowfeed's remote benchmark where nginx is not installed, on
127.0.0.1 only: GET and HEAD of the files under --root, with single `Range: bytes=A-B` / `A-` /
`-N` requests answered 206 (Content-Range) or 416, keep-alive (HTTP/1.1) and one thread per
connection (ThreadingHTTPServer; http.server alone neither threads in old Pythons nor answers
Range). Prints "port N" when it listens.
"""
import argparse
import os
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle's algorithm the body would wait for
    # the client's delayed ACK of the headers (about 40 ms a response on a kept-alive connection).
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        pass

    def empty(self, status, extra=()):
        self.send_response(status)
        for k, v in extra:
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def serve(self, body):
        root = self.server.root
        path = os.path.realpath(os.path.join(root, unquote(urlsplit(self.path).path).lstrip("/")))
        if not path.startswith(root + os.sep) or not os.path.isfile(path):
            return self.empty(404)
        size = os.path.getsize(path)
        first, last, status = 0, size - 1, 200
        header = self.headers.get("Range")
        if header:
            m = RANGE.match(header.strip())
            if not m or (m.group(1) == "" and m.group(2) == ""):
                return self.empty(416, [("Content-Range", f"bytes */{size}")])
            if m.group(1) == "":
                first = max(0, size - int(m.group(2)))
            else:
                first = int(m.group(1))
                if m.group(2) != "":
                    last = min(last, int(m.group(2)))
            if first >= size or first > last:
                return self.empty(416, [("Content-Range", f"bytes */{size}")])
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(last - first + 1))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.end_headers()
        if not body:
            return
        with open(path, "rb") as f:
            f.seek(first)
            left = last - first + 1
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                left -= len(chunk)

    def do_GET(self):
        try:
            self.serve(True)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_HEAD(self):
        self.serve(False)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client (or the fault proxy) that drops its connection is no error of the server's.
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    a = p.parse_args()
    server = Server(("127.0.0.1", 0), Handler)
    server.root = os.path.realpath(a.root)
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
