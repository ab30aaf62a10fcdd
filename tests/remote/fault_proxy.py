#!/usr/bin/env python3
"""A fault-injecting HTTP proxy for flowfeed's tests, on 127.0.0.1 only: it forwards GET and HEAD
(with their Range header) to --upstream PORT on 127.0.0.1 and, for the requests it picks, answers
503, answers 429, resets the connection mid-body (RST after half the body), sends the body
slowly, or (badrange) sends a Content-Range one byte later than the bytes it sends. Which
requests: with --rate R, each request with probability R (seeded, --seed); with --first K, the
first K requests of every path. --faults lists the kinds, taken in turn. --methods limits the
faults to some methods (GET,HEAD). --slow-s is the pause between the slow body's pieces. Prints
"port N" when it listens; appends one line per fault to --log. Apart from faults, --delay S waits
S seconds before every answer and --bandwidth B sends every body at B bytes a second (a slow
network for all requests).
"""
import argparse
import http.client
import random
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def shifted(content_range):
    """`bytes A-B/T` as `bytes A+1-B+1/T`: a range one byte later than the body sent."""
    unit, _, rest = content_range.partition(" ")
    span, _, total = rest.partition("/")
    first, _, last = span.partition("-")
    return f"{unit} {int(first) + 1}-{int(last) + 1}/{total}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle's algorithm the body would wait for
    # the client's delayed ACK of the headers (about 40 ms a response on a kept-alive connection).
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        pass

    def pick(self):
        s = self.server
        if self.command not in s.methods:
            return None
        with s.lock:
            s.count += 1
            seen = s.per_path.get(self.path, 0)
            s.per_path[self.path] = seen + 1
            faulty = seen < s.first if s.first else s.rng.random() < s.rate
            if not faulty:
                return None
            kind = s.faults[s.next_fault % len(s.faults)]
            s.next_fault += 1
            if s.log:
                with open(s.log, "a") as f:
                    f.write(f"{kind} {self.command} {self.path} {self.headers.get('Range', '')}\n")
            return kind

    def short(self, status):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        if status == 429:
            self.send_header("Retry-After", "0")
        self.end_headers()

    def handle_any(self):
        if self.server.delay > 0:
            time.sleep(self.server.delay)
        kind = self.pick()
        if kind in ("503", "429"):
            return self.short(int(kind))
        up = http.client.HTTPConnection("127.0.0.1", self.server.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        up.request(self.command, self.path, headers=headers)
        r = up.getresponse()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() == "content-range" and kind == "badrange":
                v = shifted(v)
            if k.lower() in ("content-length", "content-range", "accept-ranges", "content-type"):
                self.send_header(k, v)
        self.end_headers()
        try:
            if self.command == "GET":
                self.relay(r, kind, int(r.getheader("Content-Length") or 0))
        finally:
            up.close()

    def relay(self, r, kind, length):
        """Forwards the body as it arrives (1 MiB pieces), faulting it as `kind` says."""
        if kind == "reset" and length > 1:
            # Half the body in the same 1 MiB pieces as any body (one large write would move it
            # faster than a body without a fault), then the reset.
            left = length // 2
            while left > 0 and (piece := r.read(min(left, 1 << 20))):
                self.wfile.write(piece)
                left -= len(piece)
            self.wfile.flush()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if kind == "slow":
            step = max(1, length // 4)
            while piece := r.read(step):
                self.wfile.write(piece)
                self.wfile.flush()
                time.sleep(self.server.slow_s)
            return
        bandwidth = self.server.bandwidth
        step = 1 << 20 if bandwidth <= 0 else max(1, int(bandwidth) // 20)  # about 20 pieces a second
        while piece := r.read(step):
            self.wfile.write(piece)
            if bandwidth > 0:
                self.wfile.flush()
                time.sleep(len(piece) / bandwidth)

    def handle_quietly(self):
        try:
            self.handle_any()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (a test's Ctrl-C, a timeout)

    do_GET = handle_quietly
    do_HEAD = handle_quietly


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", type=int, required=True)
    p.add_argument("--rate", type=float, default=0.0)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--faults", default="503,429,reset,slow")
    p.add_argument("--slow-s", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log", default="")
    p.add_argument("--methods", default="GET,HEAD", help="the methods faults apply to")
    p.add_argument("--delay", type=float, default=0.0, help="seconds before every answer")
    p.add_argument("--bandwidth", type=float, default=0.0, help="bytes a second of every body")
    a = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.upstream, server.rate, server.first = a.upstream, a.rate, a.first
    server.faults, server.slow_s, server.log = a.faults.split(","), a.slow_s, a.log
    server.rng, server.lock, server.count = random.Random(a.seed), threading.Lock(), 0
    server.per_path, server.next_fault = {}, 0
    server.methods = a.methods.split(",")
    server.delay, server.bandwidth = a.delay, a.bandwidth
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
