"""S3 as a training job's own process reaches it: through its VPC's gateway endpoint, as its execution role.

SageMaker's own transfers (code, channels, checkpoints, the model) are the simulator's (storage.py). The trainer
also reads S3 itself: lustrain's trainer reads the run's stop request (trainer/lustrain_trainer/stopping.py) with
GetObject. Moto's backends live in this process (under mock_aws they have no address), so each job gets a small
HTTP stand-in on 127.0.0.1, named to the job's SDK by AWS_ENDPOINT_URL_S3 (botocore then addresses buckets by path,
as it does for any endpoint that is an IP address). What AWS would do, it does: every call is authorized as the
job's role, through the policy of the VPC endpoint its traffic takes (storage.JobStorage), and refused with S3's
own AccessDenied (403); a key that is not there is NoSuchKey (404). A job whose network has no path to S3 gets an
address where nothing listens: the SDK's connection fails, as it times out on AWS. It serves GetObject and
HeadObject; anything else is refused as not implemented.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import escape

from botocore.exceptions import ClientError

from lustrain.twin.simulator import endpoint
from lustrain.twin.simulator.storage import JobStorage, MissingBucket

#: the SDK's service-specific endpoint variable for S3
ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL_S3"



def _error(code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{escape(code)}</Code>'
        f"<Message>{escape(message)}</Message></Error>"
    ).encode()


class ObjectEndpoint:
    """One job's way to S3 objects: start() before the job's process, environment() for it, close() after."""

    def __init__(self, storage: JobStorage, reachable: bool) -> None:
        self.storage = storage
        self.reachable = reachable
        self._server: ThreadingHTTPServer | None = None

    def answer(self, path: str) -> tuple[int, bytes]:
        """GetObject of a path-style request (/bucket/key): (HTTP status, the body or S3's error document)."""
        parts = unquote(urlsplit(path).path).lstrip("/").split("/", 1)
        if len(parts) < 2 or not parts[1]:
            return 501, _error("NotImplemented", "the twin serves a job GetObject and HeadObject only")
        bucket, key = parts
        try:
            data = self.storage.get(bucket, key)
        except ClientError as refused:
            error = refused.response.get("Error", {})
            status = int(refused.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 403))
            return status, _error(str(error.get("Code", "AccessDenied")), str(error.get("Message", "")))
        except MissingBucket:
            return 404, _error("NoSuchBucket", "The specified bucket does not exist")
        if data is None:
            return 404, _error("NoSuchKey", "The specified key does not exist.")
        return 200, data

    def start(self) -> None:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, with_body: bool) -> None:
                status, body = stand_in.answer(self.path)
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream" if status == 200 else "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self._reply(True)

            def do_HEAD(self) -> None:
                self._reply(False)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = endpoint.serve(Handler)

    def environment(self) -> dict[str, str]:
        assert self._server is not None, "start() first"
        served = endpoint.address(self._server)
        return {ENDPOINT_VARIABLE: served if self.reachable else endpoint.unused_address()}

    def close(self) -> None:
        endpoint.close(self._server)
        self._server = None
