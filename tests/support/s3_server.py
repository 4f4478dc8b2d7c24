"""A real S3 endpoint for the tests: moto's server on a free loopback port, spoken to by s3fs (and
boto3, smart_open) through HTTP -- nothing of fsspec is mocked -- with a log of every request it
served (method, path, query, bytes sent), so a test can count the GETs and bytes a command costs."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import pytest

BUCKET = "mimi-test"


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # /bucket/key, as the server was asked (path-style)
    query: str
    sent: int  # response body bytes

    @property
    def kind(self) -> str:
        """GET (an object or a range of it), LIST (a listing), HEAD, PUT, DELETE, POST."""
        if self.method == "GET" and ("list-type" in self.query or self.path.rstrip("/").count("/") <= 1):
            return "LIST"
        return self.method


class RequestLog:
    """Every request the server answered, in order (a WSGI middleware in front of moto's app)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: list[Request] = []

    def wrap(self, app):
        def logged(environ, start_response):
            body = app(environ, start_response)
            try:
                chunks = list(body)
            finally:
                if hasattr(body, "close"):
                    body.close()
            with self._lock:
                self.requests.append(Request(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                                             environ.get("QUERY_STRING", ""), sum(len(c) for c in chunks)))
            return chunks

        return logged

    def mark(self) -> int:
        with self._lock:
            return len(self.requests)

    def since(self, mark: int) -> list[Request]:
        with self._lock:
            return list(self.requests[mark:])


def start_server(log: RequestLog):
    """moto's ThreadedMotoServer with ``log`` in front of its app; returns (server, endpoint URL)."""
    from moto.server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    class LoggedMotoServer(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = log.wrap(DomainDispatcherApplication(create_backend_app))
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # (one line per request otherwise)
    server = LoggedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def s3_fixture():
    """A module-scoped pytest fixture: the server, the environment that points s3fs (and boto3) at it
    (dummy keys, that module only), and one bucket; yields an s3fs filesystem on it, with the
    server's request log as its ``request_log`` attribute."""

    @pytest.fixture(scope="module")
    def s3():
        pytest.importorskip("moto.server")
        s3fs = pytest.importorskip("s3fs")
        log = RequestLog()
        server, endpoint = start_server(log)
        with pytest.MonkeyPatch.context() as mp:
            for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
                mp.setenv(name, value)
            s3fs.S3FileSystem.clear_instance_cache()  # (an instance made before would not see the endpoint)
            fs = s3fs.S3FileSystem()
            try:
                fs.mkdir(BUCKET)
            except FileExistsError:  # (moto's backend lives in the process: another module's server made it)
                pass
            fs.request_log = log
            yield fs
            s3fs.S3FileSystem.clear_instance_cache()
        server.stop()

    return s3
