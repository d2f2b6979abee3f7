"""A real smeltd keeps server/web/openapi.json's word at the edge (issue 26): a method a path
does not serve is 405 with an Allow header that lists exactly the document's methods for
that path (OPTIONS: 204 with the same); a path id outside the id alphabet is 404 naming the
id on its own route; cursors, model and api key fields are refused where the document
refuses them, with `param` naming the field."""
import http.client
import json
import pathlib

import pytest

from conftest import ADMIN_KEY, SMALL_JOB

OPENAPI = pathlib.Path(__file__).resolve().parents[2] / "server" / "web" / "openapi.json"
DOC_METHODS = {"get", "post", "delete", "put", "patch"}


def call(server, method, path, body=None, key=ADMIN_KEY):
    """(status, headers, parsed JSON or None): raw http.client, so headers and any method go."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        headers = {"Authorization": "Bearer " + key} if key else {}
        data = json.dumps(body).encode() if body is not None else None
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
        parsed = json.loads(payload) if payload and "json" in resp.getheader("Content-Type", "") else None
        return resp.status, resp, parsed
    finally:
        conn.close()


def documented_allow(path_template):
    item = json.loads(OPENAPI.read_text())["paths"][path_template]
    return {m.upper() for m in item if m in DOC_METHODS}


# (document path, a concrete path of it)
PATHS = [
    ("/v1/files", "/v1/files"),
    ("/v1/files/{file_id}", "/v1/files/file-abc"),
    ("/v1/fine_tuning/jobs", "/v1/fine_tuning/jobs"),
    ("/v1/fine_tuning/jobs/{job_id}/cancel", "/v1/fine_tuning/jobs/ftjob-x/cancel"),
    ("/v1/fine_tuning/schedules/{schedule_id}", "/v1/fine_tuning/schedules/ftsched-x"),
    ("/v1/api_keys", "/v1/api_keys"),
    ("/v1/api_keys/{key_id}", "/v1/api_keys/7"),
    ("/healthz", "/healthz"),
    ("/api/v1/training_runs/{training_run_id}", "/api/v1/training_runs/r1"),
]


@pytest.mark.parametrize("doc_path,path", PATHS)
@pytest.mark.parametrize("method", ["TRACE", "PROPFIND", "PATCH"])
def test_unserved_methods_are_405_with_the_documents_allow(smeltd, doc_path, path, method):
    status, resp, body = call(smeltd, method, path)
    assert status == 405, (status, body)
    assert body["error"]["code"] == "method_not_allowed", body
    allow = {m.strip() for m in resp.getheader("Allow", "").split(",")}
    assert allow == documented_allow(doc_path), (path, allow)


@pytest.mark.parametrize("doc_path,path", PATHS)
def test_options_answers_the_documents_allow(smeltd, doc_path, path):
    status, resp, _ = call(smeltd, "OPTIONS", path, key=None)
    assert status == 204
    allow = {m.strip() for m in resp.getheader("Allow", "").split(",")}
    assert allow == documented_allow(doc_path), (path, allow)


BAD_IDS = [
    ("GET", "/v1/files/Y%C2%80x", "file_id"),
    ("DELETE", "/v1/files/Y%C2%80x", "file_id"),
    ("GET", "/v1/files/Y%C2%80x/content", "file_id"),
    ("DELETE", "/v1/api_keys/null%2Cnull", "key_id"),
    ("GET", "/v1/fine_tuning/schedules/V%C2%88", "schedule_id"),
    ("DELETE", "/v1/fine_tuning/schedules/V%C2%88", "schedule_id"),
    ("POST", "/v1/fine_tuning/jobs/a%20b/cancel", "job_id"),
    ("POST", "/v1/fine_tuning/jobs/a%20b/pause", "job_id"),
    ("POST", "/v1/fine_tuning/jobs/a%20b/resume", "job_id"),
    ("GET", "/v1/models/%E2%82%AC", "model"),
]


@pytest.mark.parametrize("method,path,param", BAD_IDS)
def test_bad_path_ids_are_404_naming_the_id(smeltd, method, path, param):
    status, _, body = call(smeltd, method, path)
    assert status == 404, (status, body)
    assert body["error"]["param"] == param, body
    assert body["error"]["type"] == "not_found_error", body


@pytest.mark.parametrize("path", ["/v1/files?after=", "/v1/fine_tuning/jobs?after=", "/v1/files?after=a%20b",
                                  "/v1/fine_tuning/schedules?after=%C3%A9"])
def test_after_must_be_an_id(smeltd, path):
    status, _, body = call(smeltd, "GET", path)
    assert status == 400, (status, body)
    assert body["error"]["param"] == "after", body


def test_row_cursors_are_digits(smeltd, train_file_id):
    status, s = smeltd.request("POST", "/v1/fine_tuning/schedules",
                               {"cron": "0 0 1 1 *", "suspended": True,
                                "job": dict(SMALL_JOB, training_file=train_file_id)})
    assert status == 200, s
    for bad in ["abc", "-1", "1e3", "1234567890123456789"]:
        status, _, body = call(smeltd, "GET", "/v1/fine_tuning/schedules/%s/runs?after=%s" % (s["id"], bad))
        assert status == 400 and body["error"]["param"] == "after", (bad, status, body)
    status, _, body = call(smeltd, "GET", "/v1/fine_tuning/schedules/%s/runs?after=5" % s["id"])
    assert status == 200, body


@pytest.mark.parametrize("field", ["admin", "name", "project"])
def test_api_key_fields_refuse_null(smeltd, field):
    body = {"project": "contract", "name": "k", "admin": False}
    body[field] = None
    status, _, reply = call(smeltd, "POST", "/v1/api_keys", body)
    assert status == 400, (status, reply)
    assert reply["error"]["param"] == field, reply


def test_api_key_name_limit_counts_characters(smeltd):
    doc = json.loads(OPENAPI.read_text())
    limit = doc["components"]["schemas"]["ApiKeyCreateRequest"]["properties"]["name"]["maxLength"]
    status, _, reply = call(smeltd, "POST", "/v1/api_keys", {"project": "contract", "name": "é" * limit})
    assert status == 200, reply
    status, _, reply = call(smeltd, "POST", "/v1/api_keys", {"project": "contract", "name": "é" * (limit + 1)})
    assert status == 400, reply


@pytest.mark.parametrize("model", ["", None])
def test_job_model_is_required_and_not_empty(smeltd, model):
    doc = json.loads(OPENAPI.read_text())
    assert doc["components"]["schemas"]["JobCreateRequest"]["properties"]["model"]["minLength"] == 1
    status, _, reply = call(smeltd, "POST", "/v1/fine_tuning/jobs", {"model": model, "training_file": "file-x"})
    assert status == 400, reply
    assert reply["error"]["param"] == "model", reply
