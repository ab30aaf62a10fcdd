#!/usr/bin/env python3
"""A small S3 protocol server for flowfeed's tests, on 127.0.0.1 only (Python stdlib alone: no
package is downloaded in CI). It serves the files under --root as objects (the first directory
level is the bucket): ListObjectsV2 (pages of --page-keys keys, continuation tokens), GET with
Range, HEAD; path-style (/bucket/key) and virtual-host style (Host: bucket.localhost:port).
Every request must carry a SigV4 Authorization header that its own implementation of the AWS
algorithm verifies (403 SignatureDoesNotMatch / InvalidAccessKeyId otherwise).

  s3_server.py --root DIR --access-key K --secret-key S [--page-keys N] [--log FILE]
prints "port N" when it listens. `s3_server.py --selftest` checks sign() against AWS's examples.
"""
import argparse
import hashlib
import hmac
import os
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape


def _hmac(key, text):
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signing_key(secret, date, region, service):
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def canonical_query(query):
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    enc = [(urllib.parse.quote(k, safe="-_.~"), urllib.parse.quote(v, safe="-_.~")) for k, v in pairs]
    return "&".join(f"{k}={v}" for k, v in sorted(enc))


def sign(secret, method, path, query, headers, signed, payload_hash, amz_date, scope):
    """The SigV4 signature (hex) of a request: headers maps lowercase names to values."""
    canonical_headers = "".join(f"{h}:{' '.join(headers[h].strip().split())}\n" for h in signed)
    canonical = "\n".join([method, path, canonical_query(query), canonical_headers,
                           ";".join(signed), payload_hash])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    date, region, service, _ = scope.split("/")
    return hmac.new(signing_key(secret, date, region, service), to_sign.encode(),
                    hashlib.sha256).hexdigest()


EMPTY = hashlib.sha256(b"").hexdigest()


def selftest():
    # AWS SigV4 test suite, get-vanilla.
    got = sign("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "GET", "/", "",
               {"host": "example.amazonaws.com", "x-amz-date": "20150830T123600Z"},
               ["host", "x-amz-date"], EMPTY, "20150830T123600Z",
               "20150830/us-east-1/service/aws4_request")
    assert got == "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31", got
    # Amazon S3 API reference, "Example: GET Object" (header-based auth).
    got = sign("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "GET", "/test.txt", "",
               {"host": "examplebucket.s3.amazonaws.com", "range": "bytes=0-9",
                "x-amz-content-sha256": EMPTY, "x-amz-date": "20130524T000000Z"},
               ["host", "range", "x-amz-content-sha256", "x-amz-date"], EMPTY,
               "20130524T000000Z", "20130524/us-east-1/s3/aws4_request")
    assert got == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41", got
    print("selftest ok")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle's algorithm the body would wait for
    # the client's delayed ACK of the headers (about 40 ms a response on a kept-alive connection).
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        if self.server.log:
            with open(self.server.log, "a") as f:
                f.write(f"{self.command} {self.path} auth={self.headers.get('Authorization', '')}\n")

    def error(self, status, code, message):
        body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>"
                f"<Message>{escape(message)}</Message></Error>").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def authorized(self, path, query):
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            self.error(403, "AccessDenied", "Anonymous access is not allowed")
            return False
        fields = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 "):].split(","))
        key, scope = fields["Credential"].split("/", 1)
        if key != self.server.access_key:
            self.error(403, "InvalidAccessKeyId", "The AWS Access Key Id does not exist")
            return False
        signed = fields["SignedHeaders"].split(";")
        headers = {h.lower(): v for h, v in self.headers.items()}
        if any(h not in headers for h in signed):
            self.error(403, "SignatureDoesNotMatch", "A signed header is missing")
            return False
        payload = headers.get("x-amz-content-sha256", EMPTY)
        want = sign(self.server.secret_key, self.command, path, query, headers, signed, payload,
                    headers.get("x-amz-date", ""), scope)
        if not hmac.compare_digest(want, fields["Signature"]):
            self.error(403, "SignatureDoesNotMatch",
                       "The request signature we calculated does not match the signature you provided")
            return False
        return True

    def bucket_and_key(self, path):
        host = self.headers.get("Host", "").split(":")[0]
        if host.endswith(".localhost"):
            return host[: -len(".localhost")], urllib.parse.unquote(path[1:])
        parts = path[1:].split("/", 1)
        return urllib.parse.unquote(parts[0]), urllib.parse.unquote(parts[1] if len(parts) > 1 else "")

    def handle_any(self):
        path, _, query = self.path.partition("?")
        if not self.authorized(path, query):
            return
        bucket, key = self.bucket_and_key(path)
        root = os.path.join(self.server.root, bucket)
        if not bucket or not os.path.isdir(root):
            return self.error(404, "NoSuchBucket", "The specified bucket does not exist")
        if not key:
            return self.list(root, dict(urllib.parse.parse_qsl(query, keep_blank_values=True)))
        file = os.path.join(root, key)
        if not os.path.isfile(file):
            return self.error(404, "NoSuchKey", "The specified key does not exist.")
        size = os.path.getsize(file)
        start, end = 0, size - 1
        rng = self.headers.get("Range")
        if rng:
            a, _, b = rng.split("=", 1)[1].partition("-")
            start, end = int(a), (int(b) if b else size - 1)
            if start >= size:
                return self.error(416, "InvalidRange", "The requested range is not satisfiable")
            end = min(end, size - 1)
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if self.command == "GET":
            with open(file, "rb") as f:
                f.seek(start)
                left = end - start + 1
                while left:
                    chunk = f.read(min(left, 1 << 20))
                    self.wfile.write(chunk)
                    left -= len(chunk)

    def list(self, root, params):
        if params.get("list-type") != "2":
            return self.error(400, "InvalidArgument", "only ListObjectsV2 (list-type=2)")
        prefix = params.get("prefix", "")
        keys = []
        for d, _, files in os.walk(root):
            for name in files:
                k = os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/")
                if k.startswith(prefix):
                    keys.append(k)
        keys.sort(key=lambda k: k.encode())
        after = params.get("continuation-token", "")
        if after:
            keys = [k for k in keys if k.encode() > after.encode()]
        page, more = keys[: self.server.page_keys], len(keys) > self.server.page_keys
        items = "".join(f"<Contents><Key>{escape(k)}</Key><Size>{os.path.getsize(os.path.join(root, k))}"
                        f"</Size></Contents>" for k in page)
        token = f"<NextContinuationToken>{escape(page[-1])}</NextContinuationToken>" if more else ""
        body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult "
                f"xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Prefix>{escape(prefix)}</Prefix>"
                f"<KeyCount>{len(page)}</KeyCount><IsTruncated>{'true' if more else 'false'}"
                f"</IsTruncated>{token}{items}</ListBucketResult>").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = handle_any
    do_HEAD = handle_any


def main():
    if sys.argv[1:] == ["--selftest"]:
        return selftest()
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--access-key", required=True)
    p.add_argument("--secret-key", required=True)
    p.add_argument("--page-keys", type=int, default=1000)
    p.add_argument("--log", default="")
    a = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.root, server.access_key, server.secret_key = a.root, a.access_key, a.secret_key
    server.page_keys, server.log = a.page_keys, a.log
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
