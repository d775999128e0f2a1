"""A WSGI upstream on Python's wsgiref, with the method-override middleware
that Flask's documentation gives (HTTPMethodOverrideMiddleware).

wsgiref, like every CGI-style server, hands the application its headers as
HTTP_* variables with '-' and '_' both folded into '_': a request header
`X_HTTP_METHOD_OVERRIDE` reaches the middleware as the override.

Every request is applied as the method the middleware settled on and logged;
GET /__log answers the log as JSON: [{"method", "path", "token", "tenant"}].
Prints its port on its first line.
"""

import json
import sys
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class HTTPMethodOverrideMiddleware:
    allowed_methods = frozenset(["GET", "HEAD", "POST", "DELETE", "PUT", "PATCH", "OPTIONS"])
    bodyless_methods = frozenset(["GET", "HEAD", "OPTIONS", "DELETE"])

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        method = environ.get("HTTP_X_HTTP_METHOD_OVERRIDE", "").upper()
        if method in self.allowed_methods:
            environ["REQUEST_METHOD"] = method
        if method in self.bodyless_methods:
            environ["CONTENT_LENGTH"] = "0"
        return self.app(environ, start_response)


LOG = []


def app(environ, start_response):
    path = environ.get("PATH_INFO", "")
    if path == "/__log":
        body = json.dumps(LOG).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        environ["wsgi.input"].read(length)
    LOG.append(
        {
            "method": environ["REQUEST_METHOD"],
            "path": path,
            "token": environ.get("HTTP_X_FENCING_TOKEN", ""),
            "tenant": environ.get("HTTP_X_TENANT", ""),
        }
    )
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class Threading(ThreadingMixIn, WSGIServer):
    daemon_threads = True


server = make_server("127.0.0.1", 0, HTTPMethodOverrideMiddleware(app), server_class=Threading, handler_class=Quiet)
print(server.server_port, flush=True)
sys.stdout.close()
server.serve_forever()
