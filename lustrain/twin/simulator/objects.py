"""S3 as a training job's own process reaches it: through its VPC's gateway endpoint, as its execution role.

SageMaker's own transfers (code, channels, checkpoints, the model) are the simulator's (storage.py). The trainer
also reads S3 itself: lustrain's trainer reads the run's stop request (trainer/lustrain_trainer/stopping.py) with
GetObject. Moto's backends live in this process (under mock_aws they have no address), so each job gets a small
HTTP stand-in on 127.0.0.1, named to the job's SDK by AWS_ENDPOINT_URL_S3 (botocore then addresses buckets by path,
as it does for any endpoint that is an IP address). What AWS would do, it does: every call is authorized as the
job's role, through the policy of the VPC endpoint its traffic takes (storage.JobStorage), and refused with S3's
own AccessDenied (403); a key that is not there is NoSuchKey (404). A job whose network has no path to S3 gets an
address where nothing listens: the SDK's connection fails, as it times out on AWS. It serves GetObject, HeadObject,
PutObject (a single PUT of the whole body), DeleteObject and ListObjectsV2 (one page of up to 1,000 keys); anything
else is refused as not implemented.
"""

from __future__ import annotations

import hashlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

from botocore.exceptions import ClientError

from lustrain.twin.simulator import endpoint
from lustrain.twin.simulator.storage import JobStorage, MissingBucket

#: the SDK's service-specific endpoint variable for S3
ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL_S3"



#: ListObjectsV2's page: S3 returns at most 1,000 keys (MaxKeys' default and its most)
MAX_KEYS = 1000
#: the query parameters the stand-in serves: botocore's x-id on object calls; a listing's type, prefix and the
#: encoding botocore asks for (keys are returned as they are, so it decodes none)
SERVED_QUERY = frozenset({"x-id"})
SERVED_LIST_QUERY = frozenset({"x-id", "list-type", "prefix", "encoding-type"})


def _listing(bucket: str, prefix: str, found: list[tuple[str, int]]) -> bytes:
    """ListObjectsV2's answer, as S3 writes it: its first page (IsTruncated where more follow; the twin gives no
    continuation token, so a job sees only the first 1,000 keys of a larger listing)."""
    keys = found[:MAX_KEYS]
    contents = "".join(
        f"<Contents><Key>{escape(key)}</Key><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>"
        for key, size in keys
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(keys)}</KeyCount>"
        f"<MaxKeys>{MAX_KEYS}</MaxKeys><IsTruncated>{str(len(found) > MAX_KEYS).lower()}</IsTruncated>{contents}"
        "</ListBucketResult>"
    ).encode()


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

    def answer(self, path: str, method: str = "GET", body: bytes = b"", copy: bool = False) -> tuple[int, bytes]:
        """A path-style request (/bucket/key, or /bucket?list-type=2&prefix=...): (HTTP status, the body or S3's
        error document). What the stand-in does not serve (a subresource such as ?tagging, ?acl or a multipart
        upload's, a CopyObject's x-amz-copy-source, ListObjectsV2's other parameters) is refused as not
        implemented, never taken for a plain call."""
        url = urlsplit(path)
        parts = unquote(url.path).lstrip("/").split("/", 1)
        query = parse_qs(url.query, keep_blank_values=True)
        listing = method == "GET" and len(parts) == 1 and query.get("list-type") == ["2"]
        served = SERVED_LIST_QUERY if listing else SERVED_QUERY
        if method == "POST":  # a multipart upload's start and end, DeleteObjects, a POST upload
            return 501, _error("NotImplemented", "the twin's S3 stand-in for a job serves no POST")
        if copy or set(query) - served:
            what = "x-amz-copy-source" if copy else ", ".join(sorted(set(query) - served))
            return 501, _error("NotImplemented", f"the twin's S3 stand-in for a job does not serve {what}")
        try:
            if listing:
                prefix = query.get("prefix", [""])[0]
                return 200, _listing(parts[0], prefix, self.storage.keys(parts[0], prefix))
            if len(parts) < 2 or not parts[1]:
                return 501, _error("NotImplemented", "the twin serves a job GetObject, HeadObject, PutObject, "
                                   "DeleteObject and ListObjectsV2 only")  # fmt: skip
            bucket, key = parts
            if method == "PUT":
                self.storage.put(bucket, key, body)
                return 200, b""
            if method == "DELETE":
                self.storage.delete(bucket, key)
                return 204, b""
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
            def _reply(self, with_body: bool, method: str = "GET") -> None:
                sent = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "PUT" else b""
                status, body = stand_in.answer(self.path, method, sent, copy="x-amz-copy-source" in self.headers)
                self.send_response(status)
                listing = body.startswith(b"<?xml") and status == 200
                kind = "application/octet-stream" if status < 300 and not listing else "application/xml"
                self.send_header("Content-Type", kind)
                if method == "PUT" and status == 200:
                    self.send_header("ETag", f'"{hashlib.md5(sent, usedforsecurity=False).hexdigest()}"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self._reply(True)

            def do_HEAD(self) -> None:
                self._reply(False)

            def do_PUT(self) -> None:
                self._reply(True, "PUT")

            def do_DELETE(self) -> None:
                self._reply(True, "DELETE")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._reply(True, "POST")

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
