"""An S3-compatible object store, spoken with the standard library: the few calls checkpoints need (put an
object from a file, get one into a file, list a prefix, delete), each signed with AWS Signature Version 4.

The images carry no AWS SDK (the rollout workers' image is meant to stay small, and a learner needs four
calls); the signature follows AWS's published algorithm ("Create a signed AWS API request", Signature
Version 4), and the tests check it against AWS's own worked example and against a real server. A store
named by an endpoint is addressed path-style (`endpoint/bucket/key`: MinIO, SeaweedFS, Ceph); AWS itself,
with no endpoint, virtual-hosted style (`bucket.s3.region.amazonaws.com/key`).

Everything the store sends back is bounded: answers other than an object's bytes are read up to
`ANSWER_BYTES_MAX`, an object up to the caller's limit, every socket operation within `timeout` seconds,
and a redirect is an error (http.client follows none), so the credentials never go anywhere else.
Credentials are AWS's own environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and, for
temporary ones, AWS_SESSION_TOKEN): on a cluster the learner pod gets them from the job's Secret.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import hmac
import http.client
import os
import re
import urllib.parse
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kuberl.api.job import S3_URI_PATTERN

#: Bytes read from any answer that is not an object's content (an error, a listing page).
ANSWER_BYTES_MAX = 4 << 20
#: Listing pages followed for one prefix (1,000 keys a page): far more checkpoints than keepLast allows.
LIST_PAGES_MAX = 100
_CHUNK = 1 << 20
#: Characters SigV4 leaves unescaped in a path or a query (RFC 3986's unreserved set).
_UNRESERVED = "-_.~"


class ObjectStoreError(RuntimeError):
    """A call that failed: `status` is the store's HTTP status when it answered (None when it could not be
    reached), `code` its S3 error code (AccessDenied, NoSuchBucket, ...). A RuntimeError: a learner that
    cannot reach its store at the start fails with this line, and its pod is retried."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code

    @property
    def refused(self) -> bool:
        """The store answered and will not do it whatever the retries: wrong or missing credentials, or
        no such bucket. A job with this error cannot run until someone fixes its spec or its Secret."""
        return self.status in (400, 401, 403) or self.code == "NoSuchBucket"


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    session_token: str | None = None

    @classmethod
    def from_environment(cls) -> Credentials | None:
        access, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not access or not secret:
            return None
        return cls(access, secret, os.environ.get("AWS_SESSION_TOKEN") or None)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix/"), the prefix empty or ending in one /."""
    if re.fullmatch(S3_URI_PATTERN, uri) is None:  # the job model's rule, which the spec was held to
        raise ValueError(f"{uri!r} is not s3://bucket/prefix")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _quote(text: str, safe: str = "") -> str:
    return urllib.parse.quote(text, safe=_UNRESERVED + safe)


def sign(method: str, host: str, path: str, query: dict[str, str], headers: dict[str, str], payload_sha256: str,
         credentials: Credentials, region: str, when: datetime.datetime, service: str = "s3") -> dict[str, str]:
    """`headers` plus x-amz-date, x-amz-content-sha256 (for S3), the session token where there is one, and
    Authorization: AWS Signature Version 4 over the method, the path (already escaped), the query, every
    header given and the payload's SHA-256."""
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    signed = {k.lower(): " ".join(str(v).split()) for k, v in headers.items()}
    signed["host"] = host
    signed["x-amz-date"] = stamp
    if service == "s3":
        signed["x-amz-content-sha256"] = payload_sha256
    if credentials.session_token:
        signed["x-amz-security-token"] = credentials.session_token
    names = sorted(signed)
    canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))
    canonical = "\n".join([method, path, canonical_query, *(f"{n}:{signed[n]}" for n in names), "",
                           ";".join(names), payload_sha256])
    scope = f"{stamp[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{credentials.secret_key}".encode(), stamp[:8]), region), service),
                "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    signed["authorization"] = (f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
                               f"SignedHeaders={';'.join(names)}, Signature={signature}")
    signed.pop("host")
    return signed


def _xml(body: bytes) -> ElementTree.Element:
    """An answer's XML. S3 answers carry no DTD; one that does could define entities that expand to far
    more than the bytes read (the "billion laughs"), so it is refused before parsing."""
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        raise ElementTree.ParseError("a DTD in the store's answer")
    return ElementTree.fromstring(body)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class S3Client:
    """One bucket's objects at `endpoint` (path-style) or on AWS (virtual-hosted, when endpoint is None)."""

    def __init__(self, bucket: str, credentials: Credentials, endpoint: str | None = None,
                 region: str = "us-east-1", timeout: float = 30.0):
        self.bucket, self.credentials, self.region, self.timeout = bucket, credentials, region, timeout
        if endpoint is None:
            self._scheme, self._host, self._base = "https", f"{bucket}.s3.{region}.amazonaws.com", ""
        else:
            parts = urllib.parse.urlsplit(endpoint)
            self._scheme, self._host = parts.scheme, parts.netloc
            self._base = f"{parts.path.rstrip('/')}/{bucket}"
        self.where = f"{self._scheme}://{self._host}{self._base}"

    def with_timeout(self, timeout: float) -> S3Client:
        """The same store, each socket operation bounded by `timeout` seconds instead."""
        other = copy.copy(self)
        other.timeout = timeout
        return other

    # ---- the calls -------------------------------------------------------------------------------

    def put_file(self, key: str, path: Path, content_type: str = "application/octet-stream",
                 sha256: str | None = None) -> None:
        """`path`'s bytes as `key`; `sha256`, when the caller has it already, spares reading the file twice."""
        digest, size = sha256 or file_sha256(path), path.stat().st_size
        with path.open("rb") as body:
            self._call("PUT", key, {}, {"Content-Type": content_type, "Content-Length": str(size)}, digest, body)

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        self._call("PUT", key, {}, {"Content-Type": content_type, "Content-Length": str(len(data))},
                   hashlib.sha256(data).hexdigest(), data)

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        chunks = list(self._get(key, max_bytes))
        return b"".join(chunks)

    def get_file(self, key: str, path: Path, max_bytes: int) -> str:
        """The object into `path`; returns its SHA-256."""
        digest = hashlib.sha256()
        with path.open("wb") as out:
            for chunk in self._get(key, max_bytes):
                digest.update(chunk)
                out.write(chunk)
        return digest.hexdigest()

    def create_bucket(self) -> None:
        """The bucket itself (in the client's region; us-east-1 takes no location)."""
        body = b"" if self.region == "us-east-1" else (
            '<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><LocationConstraint>'
            f"{self.region}</LocationConstraint></CreateBucketConfiguration>").encode()
        self._call("PUT", "", {}, {"Content-Length": str(len(body))}, hashlib.sha256(body).hexdigest(), body)

    def delete(self, key: str) -> None:
        self._call("DELETE", key, {}, {}, _EMPTY_SHA256, None)

    def list_keys(self, prefix: str) -> list[str]:
        """Every key under `prefix` (ListObjectsV2, page by page)."""
        keys: list[str] = []
        token: str | None = None
        for _ in range(LIST_PAGES_MAX):
            query = {"list-type": "2", "prefix": prefix, **({"continuation-token": token} if token else {})}
            try:
                root = _xml(self._call("GET", "", query, {}, _EMPTY_SHA256, None))
            except ElementTree.ParseError as err:
                raise ObjectStoreError(f"{self.where}/{prefix}: the listing is not S3's XML ({err})") from None
            ns = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
            keys.extend(el.text or "" for el in root.iter(f"{ns}Key"))
            truncated = (root.findtext(f"{ns}IsTruncated") or "").strip().lower() == "true"
            token = root.findtext(f"{ns}NextContinuationToken")
            if not truncated or not token:
                return keys
        raise ObjectStoreError(f"{self.where}/{prefix}: more than {LIST_PAGES_MAX} pages of keys")

    # ---- the wire ---------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._host, timeout=self.timeout)

    def _request(self, method: str, key: str, query: dict[str, str], headers: dict[str, str],
                 payload_sha256: str, body: bytes | IO[bytes] | None) -> tuple[http.client.HTTPConnection,
                                                                             http.client.HTTPResponse]:
        path = _quote(f"{self._base}/{key}", safe="/")
        signed = sign(method, self._host, path, query, headers, payload_sha256, self.credentials, self.region,
                      datetime.datetime.now(datetime.timezone.utc))
        url = path + ("?" + "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items())) if query else "")
        conn = self._connection()
        try:
            conn.request(method, url, body=body, headers=signed)
            return conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            raise ObjectStoreError(f"{method} {self.where}/{key}: cannot reach the store "
                                   f"({type(err).__name__}: {err})") from None

    def _call(self, method: str, key: str, query: dict[str, str], headers: dict[str, str],
              payload_sha256: str, body: bytes | IO[bytes] | None) -> bytes:
        conn, response = self._request(method, key, query, headers, payload_sha256, body)
        try:
            data = response.read(ANSWER_BYTES_MAX + 1)
            if response.status >= 300:
                raise self._error(method, key, response.status, data)
            if len(data) > ANSWER_BYTES_MAX:
                raise ObjectStoreError(f"{method} {self.where}/{key}: an answer over {ANSWER_BYTES_MAX} bytes")
            return data
        except (OSError, http.client.HTTPException) as err:
            raise ObjectStoreError(f"{method} {self.where}/{key}: cut off ({type(err).__name__}: {err})") from None
        finally:
            conn.close()

    def _get(self, key: str, max_bytes: int) -> Iterator[bytes]:
        conn, response = self._request("GET", key, {}, {}, _EMPTY_SHA256, None)
        try:
            if response.status >= 300:
                raise self._error("GET", key, response.status, response.read(ANSWER_BYTES_MAX))
            length = response.getheader("Content-Length")
            if length is not None and int(length) > max_bytes:
                raise ObjectStoreError(f"GET {self.where}/{key}: {int(length)} bytes, over the {max_bytes} allowed")
            read = 0
            while chunk := response.read(_CHUNK):
                read += len(chunk)
                if read > max_bytes:
                    raise ObjectStoreError(f"GET {self.where}/{key}: over the {max_bytes} bytes allowed")
                yield chunk
            if length is not None and read != int(length):
                raise ObjectStoreError(f"GET {self.where}/{key}: cut off after {read} of {length} bytes")
        except (OSError, http.client.HTTPException, ValueError) as err:
            raise ObjectStoreError(f"GET {self.where}/{key}: cut off ({type(err).__name__}: {err})") from None
        finally:
            conn.close()

    def _error(self, method: str, key: str, status: int, body: bytes) -> ObjectStoreError:
        code = message = None
        try:
            root = _xml(body) if body.strip() else None
        except ElementTree.ParseError:
            root = None
        if root is not None:
            code, message = root.findtext("Code"), root.findtext("Message")
        said = f"{code}: {message}" if code and message else code or f"HTTP {status}"
        return ObjectStoreError(f"{method} {self.where}/{key}: {said[:300]}", status=status, code=code)
