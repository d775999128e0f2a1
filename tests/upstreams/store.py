#!/usr/bin/env python3
"""A legacy HTTP store, as the upstreams fencegate fronts behave in production.

Standard library only. It binds 127.0.0.1:0, prints its port on stdout and serves
until it is killed. It is a witness for the tests: it applies writes the way real
servers resolve them, and records every write it applied.

How it reads a request, like http.server, Werkzeug/Flask, Django and nginx do:

- HTTP/1.1 keep-alive. A GET's body is never read, so on a kept-alive connection
  it is parsed as the next request (what the real http.server does).
- The method is upper-cased before dispatch (Werkzeug, Django): `put` runs PUT.
- `X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override` (the first one
  present, in that order) on a GET or POST replace the method (common middleware).
- The path names a resource the way nginx and SimpleHTTPRequestHandler map it to a
  file: percent-decoded fully (once), read as UTF-8 with each invalid sequence
  replaced by U+FFFD (Werkzeug's `errors="replace"`; query values too), backslashes taken as slashes (as Windows
  servers do), repeated slashes merged, `.` and `..` resolved; a dot segment with a
  `;` parameter counts as that dot segment (Tomcat); climbing above the root is a 400.
- The query parameter `id`, form-decoded like `request.args.get("id")` (first value
  wins), selects an item: the resource is then `<path>?id=<value>`.
- The virtual host comes from the absolute-form authority or `Host`: lower-cased,
  the port removed, one trailing dot removed.
- Header values are stripped of leading and trailing spaces and tabs. `X-Tenant`
  selects a tenant.
- Bodies are read by `Content-Length` (a short read at the end of the stream keeps
  what arrived, as `rfile.read(n)` does) or chunked.

What it applies:

- PUT, POST, PATCH store the body at the resource; DELETE removes it.
- COPY and MOVE store the resource's object at the resource named by `Destination`
  (an absolute URI or a path, resolved like a request path); MOVE also removes the
  source.
- GET, HEAD, OPTIONS and PROPFIND read (a PROPFIND's body is read and ignored).
- Any other method (MKCOL, PROPPATCH, LOCK, an extension) is recorded as applied to
  the resource (a WebDAV server changes collections, properties or locks there);
  the stored object stays as it is.
- `X-Slow-Ms: N` sleeps N ms after the body is read and before the write is applied
  and answered; the write is applied even if the client is gone by then.

Internal endpoints (read by the tests directly, never through fencegate):

- `GET /__log`: every write applied, in order: `seq`, `vhost`, `tenant`,
  `resource`, `method` (as applied), `sent_method` (as received), `target` (the
  request target as received), `host` and `destination` (those headers as
  received, or null), `token` (`X-Fencing-Token`, or null), `body`
  (latin-1), `body_len`.
- `GET /__objects`: the stored objects: `vhost`, `tenant`, `resource`, `body`.
- `GET /__state`: `active` (requests being handled, this one excluded) and
  `pending` (writes whose body was read and that are not applied yet).
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit

OVERRIDES = ("X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override")
STORING = ("PUT", "POST", "PATCH")

lock = threading.Lock()
log = []
objects = {}  # (vhost, tenant, resource) -> bytes
pending = []  # dicts of writes waiting to be applied
active = 0


def vhost_of(authority):
    """The virtual host nginx would pick for a Host value."""
    host = authority.strip(" \t").lower()
    if host.startswith("["):
        host = host[: host.find("]") + 1]
    elif ":" in host:
        host = host.rsplit(":", 1)[0]
    if host.endswith("."):
        host = host[:-1]
    return host


def resolve(raw_path):
    """The resource a path names, or None when it climbs above the root."""
    # As Werkzeug reads a path: bytes that are not UTF-8 become U+FFFD, so
    # `/a%FF` and `/a%FE` name one resource.
    decoded = unquote_to_bytes(raw_path).decode("utf-8", "replace")
    decoded = decoded.replace("\\", "/")
    if not decoded.startswith("/"):
        return None
    out = []
    trailing = False
    for segment in decoded.split("/")[1:]:
        bare = segment.split(";", 1)[0]
        trailing = segment == "" or bare in (".", "..")
        if segment == "" or bare == ".":
            continue
        if bare == "..":
            if not out:
                return None
            out.pop()
            continue
        out.append(segment)
    path = "/" + "/".join(out)
    if trailing and out:
        path += "/"
    return path


def split_target(target):
    """(authority or None, path, query) of a request target."""
    lowered = target.lower()
    if lowered.startswith("http://") or lowered.startswith("https://"):
        parts = urlsplit(target)
        return parts.netloc, parts.path or "/", parts.query
    path, _, query = target.partition("?")
    return None, path, query


def item_resource(path, query):
    if path is None:
        return None
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name == "id":
            return f"{path}?id={value}"
    return path


def text(body):
    return body.decode("latin-1")


class Store(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "legacy-store/1"

    def log_message(self, format, *args):
        pass

    def handle_one_request(self):
        """The standard library's loop step, but every method goes through
        `dispatch` after it is upper-cased, as WSGI frameworks do."""
        global active
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self.requestline = ""
                self.request_version = ""
                self.command = ""
                self.send_error(414)
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            with lock:
                active += 1
            try:
                if not self.parse_request():
                    return
                self.sent_method = self.command
                self.command = self.command.upper()
                self.dispatch()
                self.wfile.flush()
            finally:
                with lock:
                    active -= 1
        except (TimeoutError, ConnectionError, ValueError):
            # The client went away (or sent garbage): like http.server, drop it.
            self.close_connection = True

    def header(self, name):
        value = self.headers.get(name)
        return None if value is None else value.strip(" \t")

    def answer(self, status, body=b"", content_type="application/json"):
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()
        except (ConnectionError, ValueError):
            self.close_connection = True

    def answer_json(self, status, value):
        self.answer(status, json.dumps(value).encode())

    def read_body(self):
        if (self.header("Transfer-Encoding") or "").lower() == "chunked":
            body = b""
            while True:
                line = self.rfile.readline(65537)
                if not line:
                    return body
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline(65537)
        length = int(self.header("Content-Length") or "0")
        return self.rfile.read(length) if length > 0 else b""

    def dispatch(self):
        authority, raw_path, query = split_target(self.path)
        if self.command == "GET" and authority is None:
            internal = {"/__log": self.show_log, "/__objects": self.show_objects, "/__state": self.show_state}
            if raw_path in internal:
                internal[raw_path]()
                return

        host = authority if authority is not None else (self.header("Host") or "")
        vhost = vhost_of(host)
        tenant = self.header("X-Tenant") or ""
        method = self.command
        if method in ("GET", "POST"):
            for name in OVERRIDES:
                value = self.header(name)
                if value:
                    method = value.upper()
                    break
        resource = item_resource(resolve(raw_path), query)
        if resource is None:
            self.answer(400, b"bad path", "text/plain")
            self.close_connection = True
            return

        if method in ("GET", "HEAD"):
            with lock:
                found = objects.get((vhost, tenant, resource))
            if found is None:
                self.answer(404, b"not found", "text/plain")
            else:
                self.answer(200, found, "application/octet-stream")
            return
        if method == "OPTIONS":
            self.answer(200, b"")
            return
        if method == "PROPFIND":
            # A WebDAV read: the body is a query, nothing changes.
            self.read_body()
            self.answer(207, b"<multistatus/>", "application/xml")
            return

        body = self.read_body()
        destination = None
        if method in ("COPY", "MOVE"):
            dest = self.header("Destination") or ""
            dest_authority, dest_path, dest_query = split_target(dest)
            destination = item_resource(resolve(dest_path) if dest_path.startswith("/") else None, dest_query)
            if destination is None:
                self.answer(400, b"bad destination", "text/plain")
                return

        write = {
            "vhost": vhost,
            "tenant": tenant,
            "resource": resource,
            "method": method,
            "sent_method": self.sent_method,
            "target": self.path,
            "host": self.header("Host"),
            "destination": self.header("Destination"),
            "token": self.header("X-Fencing-Token"),
            "body": text(body),
            "body_len": len(body),
        }
        slow = int(self.header("X-Slow-Ms") or "0")
        with lock:
            pending.append(write)
        try:
            if slow > 0:
                time.sleep(slow / 1000)
            status = self.apply(write, destination)
        finally:
            with lock:
                pending.remove(write)
        self.answer_json(status, {"len": len(body)})

    def apply(self, write, destination):
        place = (write["vhost"], write["tenant"], write["resource"])
        method = write["method"]
        with lock:
            if method in ("COPY", "MOVE"):
                source = objects.get(place)
                if source is None:
                    return 404
                target = (write["vhost"], write["tenant"], destination)
                objects[target] = source
                record(dict(write, resource=destination, body=text(source), body_len=len(source)))
                if method == "MOVE":
                    del objects[place]
                    record(dict(write, body="", body_len=0))
                return 201
            if method in STORING:
                objects[place] = write["body"].encode("latin-1")
            elif method == "DELETE":
                objects.pop(place, None)
            record(write)
            return 200

    def show_log(self):
        with lock:
            entries = list(log)
        self.answer_json(200, entries)

    def show_objects(self):
        with lock:
            stored = [
                {"vhost": v, "tenant": t, "resource": r, "body": text(b)} for (v, t, r), b in objects.items()
            ]
        self.answer_json(200, stored)

    def show_state(self):
        with lock:
            state = {"active": active - 1, "pending": list(pending)}
        self.answer_json(200, state)


def record(write):
    """Appends an applied write to the log (the caller holds the lock)."""
    log.append(dict(write, seq=len(log)))


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that hangs up is not news; anything else is worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main():
    server = Server(("127.0.0.1", 0), Store)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
