"""spec.checkpointing.s3 and the S3 client under it: the signature against AWS's own worked examples, the
field's checks, the learner pod's credentials straight from the Secret (and no other pod's), an account's
token Secret refused, and what a store sends back read as hostile data (manifests, listings with a DTD,
sizes past the limit). The client against a real store: tests/integration/test_s3_checkpoints.py."""

from __future__ import annotations

import datetime
import hashlib
import http.server
import json
import threading
from pathlib import Path

import pytest

from kuberl.api.load import parse_job
from kuberl.api.problems import InvalidJob
from kuberl.api.tenancy import Tenancy, problems
from kuberl.operator import builders
from kuberl.operator.builders import BuildOptions
from kuberl.trainer.checkpoint_store import ObjectCheckpoints, _manifest
from kuberl.trainer.object_store import Credentials, ObjectStoreError, S3Client, parse_s3_uri, sign

# AWS's example credentials and the four requests of "Examples: Signature Calculations in AWS Signature
# Version 4" (Amazon S3 API Reference, sig-v4-header-based-auth), with the signatures AWS prints for them.
AWS_EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
AWS_DAY = datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc)
EMPTY = hashlib.sha256(b"").hexdigest()
HOST = "examplebucket.s3.amazonaws.com"


@pytest.mark.parametrize(("method", "path", "query", "headers", "payload", "signed", "signature"), [
    ("GET", "/test.txt", {}, {"Range": "bytes=0-9"}, EMPTY, "host;range;x-amz-content-sha256;x-amz-date",
     "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
    ("PUT", "/test%24file.text", {}, {"Date": "Fri, 24 May 2013 00:00:00 GMT",
                                      "x-amz-storage-class": "REDUCED_REDUNDANCY"},
     hashlib.sha256(b"Welcome to Amazon S3.").hexdigest(),
     "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
     "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"),
    ("GET", "/", {"lifecycle": ""}, {}, EMPTY, "host;x-amz-content-sha256;x-amz-date",
     "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
    ("GET", "/", {"max-keys": "2", "prefix": "J"}, {}, EMPTY, "host;x-amz-content-sha256;x-amz-date",
     "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
])
def test_the_signature_is_aws_own_on_its_worked_examples(method, path, query, headers, payload, signed, signature):
    out = sign(method, HOST, path, query, headers, payload, AWS_EXAMPLE, "us-east-1", AWS_DAY)
    assert out["authorization"] == ("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
                                    f"aws4_request, SignedHeaders={signed}, Signature={signature}")
    assert out["x-amz-date"] == "20130524T000000Z" and out["x-amz-content-sha256"] == payload


def test_a_session_token_is_sent_and_signed():
    out = sign("GET", HOST, "/", {}, {}, EMPTY, Credentials("AK", "SK", "TOKEN"), "us-east-1", AWS_DAY)
    assert out["x-amz-security-token"] == "TOKEN"
    assert "x-amz-security-token" in out["authorization"].split("SignedHeaders=")[1].split(",")[0]


@pytest.mark.parametrize(("uri", "bucket", "prefix"), [
    ("s3://ckpt", "ckpt", ""), ("s3://ckpt/", "ckpt", ""), ("s3://ckpt/runs/a", "ckpt", "runs/a/"),
    ("s3://my.bucket-1/runs/a/", "my.bucket-1", "runs/a/")])
def test_a_uri_is_a_bucket_and_a_prefix_ending_in_one_slash(uri, bucket, prefix):
    assert parse_s3_uri(uri) == (bucket, prefix)


def with_s3(job_dict: dict, **s3) -> dict:
    job_dict["spec"]["checkpointing"]["s3"] = {"uri": "s3://ckpt/runs/cartpole", **s3}
    return job_dict


@pytest.mark.parametrize(("field", "value"), [
    ("uri", "s3://Ckpt/run"), ("uri", "s3://ab/run"), ("uri", "http://ckpt/run"), ("uri", "s3://ckpt/a b"),
    ("endpoint", "ftp://store:9000"), ("endpoint", "http://key:secret@store:9000"), ("region", "US East"),
    ("resumeFrom", "s3://ckpt/run?x=1")])
def test_a_field_outside_its_form_is_refused_naming_it(job_dict, field, value):
    with pytest.raises(InvalidJob) as err:
        parse_job(with_s3(job_dict, **{field: value}))
    assert [p.path for p in err.value.problems] == [f"spec.checkpointing.s3.{field}"], err.value.problems


def test_the_learner_gets_the_keys_from_the_secret_and_no_other_pod_does(job_dict):
    job = parse_job(with_s3(job_dict, endpoint="http://store.storage:8333", credentialsSecret="store-keys"))
    learner = builders.build_learner_pod(job, BuildOptions())
    env = {e["name"]: e for e in learner["spec"]["containers"][0]["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "store-keys", "key": key,
                                                                         "optional": True}}}
    for pod in (builders.build_head_pod(job, BuildOptions()), builders.build_worker_pod(job, BuildOptions(), 0)):
        names = {e["name"] for c in pod["spec"]["containers"] for e in c.get("env", [])}
        assert not names & set(builders.OBJECT_STORE_SECRET_KEYS), names


def test_an_accounts_token_secret_is_refused_as_credentials(job_dict):
    job = parse_job(with_s3(job_dict, credentialsSecret="default-token-x2b4z"))
    job.metadata.namespace = "team-a"
    found = problems(job, Tenancy({}))
    assert [p.path for p in found] == ["spec.checkpointing.s3.credentialsSecret"], found
    assert "token Secret of ServiceAccount 'default'" in found[0].message
    job.spec.checkpointing.s3.credentials_secret = "store-keys"
    assert problems(job, Tenancy({})) == []


def manifest(**changes) -> bytes:
    data = {"format": 1, "iteration": 7, "object": "ckpt-000000007.pt", "bytes": 1234, "sha256": "a" * 64,
            "job": "j", "written": 1.0, **changes}
    return json.dumps(data).encode()


def test_a_manifest_is_taken_only_as_written():
    assert _manifest(manifest(), 7)["bytes"] == 1234


@pytest.mark.parametrize("raw", [
    manifest(object="../other/ckpt-000000007.pt"), manifest(object="ckpt-000000008.pt"), manifest(format=2),
    manifest(bytes=-1), manifest(bytes=True), manifest(bytes=1 << 40), manifest(sha256="A" * 64),
    manifest(sha256=None), b'{"format": 1, "bytes": NaN}', b"[1, 2]", b"\xff\xfe"])
def test_a_manifest_out_of_its_form_is_refused_before_anything_is_fetched_on_its_word(raw):
    with pytest.raises(ValueError):
        _manifest(raw, 7)


class _Store(http.server.BaseHTTPRequestHandler):
    """A server answering every request with `answer` (status, body, headers): what a hostile store sends."""

    answer: tuple[int, bytes, dict[str, str]] = (200, b"", {})
    #: The answer to a listing (ListObjectsV2), when set; else `answer` too.
    listing: bytes | None = None

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        status, body, headers = self.answer
        if self.listing is not None and "list-type=2" in self.path:
            status, body, headers = 200, self.listing, {}
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def hostile():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    _Store.listing = None


def client_of(server) -> S3Client:
    return S3Client("ckpt", Credentials("AK", "SK"), f"http://127.0.0.1:{server.server_address[1]}")


def test_a_listing_with_a_dtd_is_refused_unparsed(hostile):
    _Store.answer = (200, b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><ListBucketResult>'
                          b"<Key>&a;</Key></ListBucketResult>", {})
    with pytest.raises(ObjectStoreError, match="not S3's XML"):
        client_of(hostile).list_keys("runs/")


def test_an_object_past_its_limit_is_refused(hostile, tmp_path: Path):
    _Store.answer = (200, b"x" * 5000, {})
    with pytest.raises(ObjectStoreError, match="over the 1000"):
        client_of(hostile).get_file("runs/ckpt-000000001.pt", tmp_path / "out", 1000)


def test_a_redirect_is_an_error_not_followed(hostile):
    _Store.answer = (307, b"", {"Location": "http://elsewhere.example/"})
    with pytest.raises(ObjectStoreError) as err:
        client_of(hostile).get_bytes("runs/x", 100)
    assert err.value.status == 307


@pytest.mark.parametrize(("status", "body", "refused"), [
    (403, b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>", True),
    (404, b"<Error><Code>NoSuchBucket</Code><Message>none</Message></Error>", True),
    (503, b"<Error><Code>SlowDown</Code><Message>later</Message></Error>", False),
    (500, b"not xml at all", False)])
def test_what_the_store_refuses_for_good_is_told_from_what_may_pass(hostile, status, body, refused):
    _Store.answer = (status, body, {})
    with pytest.raises(ObjectStoreError) as err:
        client_of(hostile).get_bytes("runs/x", 100)
    assert err.value.refused is refused and err.value.status == status


TWO_CHECKPOINTS = (b"<ListBucketResult><Key>runs/ckpt-000000001.json</Key><Key>runs/ckpt-000000001.pt</Key>"
                   b"<Key>runs/ckpt-000000002.json</Key><Key>runs/ckpt-000000002.pt</Key></ListBucketResult>")


def test_a_newest_checkpoint_the_store_fails_to_serve_stops_the_load_rather_than_take_an_older_one(hostile):
    """A 503 may pass: the newest may be whole, and resuming from the one before would redo its steps."""
    _Store.listing = TWO_CHECKPOINTS
    _Store.answer = (503, b"<Error><Code>SlowDown</Code><Message>later</Message></Error>", {})
    with pytest.raises(ObjectStoreError) as err:
        ObjectCheckpoints("s3://ckpt/runs", client_of(hostile), "runs/").load_latest()
    assert "ckpt-000000002.json" in str(err.value)


def test_checkpoints_whose_files_are_gone_are_passed_over(hostile):
    _Store.listing = TWO_CHECKPOINTS
    _Store.answer = (404, b"<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>", {})
    assert ObjectCheckpoints("s3://ckpt/runs", client_of(hostile), "runs/").load_latest() is None
