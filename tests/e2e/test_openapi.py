"""server/web/openapi.json describes exactly the routes of server/routes.c.

No server needed: `python3 -m pytest tests/e2e/test_openapi.py` (or run this file).
The route table is parsed from the C source, so adding a route without documenting it
(or documenting one that does not exist) fails here.
"""
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROUTES_C = ROOT / "server" / "routes.c"
OPENAPI = ROOT / "server" / "web" / "openapi.json"

METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
ROUTE_RE = re.compile(r'\{\s*"([A-Z]+)"\s*,\s*"([^"]+)"\s*,\s*(\w+)\s*,\s*([^}]*?)\s*\}')
STATIC_PARAM = "path"  # the OpenAPI name of routes.c's trailing "*" segment


def load_routes():
    """[(method, openapi_path, handler, flags)] from the SERVER_ROUTES table."""
    text = ROUTES_C.read_text()
    start = text.index("SERVER_ROUTES[]")
    table = text[start:text.index("};", start)]
    table = re.sub(r"/\*.*?\*/", "", table, flags=re.S)
    routes = []
    for method, pattern, handler, flags in ROUTE_RE.findall(table):
        if pattern.endswith("/*"):
            pattern = pattern[:-1] + "{" + STATIC_PARAM + "}"
        routes.append((method.lower(), pattern, handler, set(re.findall(r"HTTP_\w+", flags))))
    return routes


def load_doc():
    return json.loads(OPENAPI.read_text())


def operations(doc):
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield method, path, op


def test_routes_parse():
    routes = load_routes()
    assert len(routes) >= 30, f"parsed only {len(routes)} routes from {ROUTES_C}"
    assert ("get", "/v1/fine_tuning/jobs", "api_jobs_list", set()) in routes


def test_openapi_is_3_1():
    doc = load_doc()
    assert doc["openapi"].startswith("3.1"), doc["openapi"]
    for key in ("info", "paths", "components"):
        assert key in doc, key
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


def test_every_route_is_documented():
    doc = load_doc()
    documented = {(m, p) for m, p, _ in operations(doc)}
    missing = [f"{m.upper()} {p}" for m, p, _, _ in load_routes() if (m, p) not in documented]
    assert not missing, f"routes of server/routes.c missing from openapi.json: {missing}"


def test_nothing_documented_that_is_not_routed():
    routed = {(m, p) for m, p, _, _ in load_routes()}
    extra = [f"{m.upper()} {p}" for m, p, _ in operations(load_doc()) if (m, p) not in routed]
    assert not extra, f"openapi.json documents routes server/routes.c does not have: {extra}"


def test_auth_matches_route_flags():
    ops = {(m, p): op for m, p, op in operations(load_doc())}
    for method, path, _, flags in load_routes():
        op = ops[(method, path)]
        public = op.get("security") == []
        assert public == ("HTTP_PUBLIC" in flags), f"{method.upper()} {path}: security vs HTTP_PUBLIC"
        admin = bool(op.get("x-smelt-admin"))
        assert admin == ("HTTP_ADMIN" in flags), f"{method.upper()} {path}: x-smelt-admin vs HTTP_ADMIN"
        if not public:
            assert "401" in op["responses"], f"{method.upper()} {path}: needs a key, so documents 401"
        if admin:
            assert "403" in op["responses"], f"{method.upper()} {path}: admin route documents 403"


def resolve(doc, node):
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        target = doc
        for part in ref[2:].split("/"):
            target = target[part]
        node = target
    return node


def test_path_parameters_declared():
    doc = load_doc()
    for method, path, op in operations(doc):
        params = [resolve(doc, p) for p in op.get("parameters", []) + doc["paths"][path].get("parameters", [])]
        declared = {p["name"] for p in params if p["in"] == "path"}
        wanted = set(re.findall(r"\{(\w+)\}", path))
        assert declared == wanted, f"{method.upper()} {path}: path parameters {declared} != {wanted}"
        for p in params:
            if p["in"] == "path":
                assert p.get("required") is True, f"{method.upper()} {path}: {p['name']} must be required"


def test_refs_resolve():
    doc = load_doc()

    def walk(node, where):
        if isinstance(node, dict):
            if "$ref" in node:
                try:
                    resolve(doc, node)
                except (KeyError, AssertionError):
                    raise AssertionError(f"{where}: unresolved {node['$ref']}")
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(doc, "#")


def test_errors_use_the_envelope():
    doc = load_doc()
    envelope = doc["components"]["schemas"]["Error"]
    assert set(envelope["properties"]["error"]["required"]) == {"message", "type", "param", "code"}
    for method, path, op in operations(doc):
        assert any(code.startswith("2") for code in op["responses"]), f"{method.upper()} {path}: no 2xx"
        for code, response in op["responses"].items():
            if code.startswith("2"):
                continue
            schema = resolve(doc, response)["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/Error"}, f"{method.upper()} {path} {code}"


def test_operation_ids_unique():
    ids = [op.get("operationId") for _, _, op in operations(load_doc())]
    assert all(ids), "every operation has an operationId"
    assert len(ids) == len(set(ids)), "operationIds are unique"


if __name__ == "__main__":
    import sys
    failed = 0
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"ok   {name}")
            except AssertionError as e:
                failed += 1
                print(f"FAIL {name}: {e}")
    sys.exit(1 if failed else 0)


def id_pattern():
    """HTTP_ID_PATTERN from server/http.h: what the router and the paging cursor accept."""
    m = re.search(r'#define HTTP_ID_PATTERN "([^"]+)"', (ROOT / "server" / "http.h").read_text())
    assert m, "server/http.h has no HTTP_ID_PATTERN"
    return m.group(1)


def test_ids_carry_the_routers_pattern():
    """Every path parameter and every id cursor (`after` of a string type) states exactly the
    id rule the router enforces (a path id outside it is 404 naming it), except the static
    files' path and the integer key_id."""
    doc, pattern = load_doc(), id_pattern()
    for method, path, op in operations(doc):
        for p in op.get("parameters", []):
            p = resolve(doc, p)
            schema = p.get("schema", {})
            is_id = p["in"] == "path" and p["name"] != STATIC_PARAM and schema.get("type") == "string"
            if p["in"] == "query" and p["name"] == "after" and schema.get("type") == "string":
                is_id = "ftevent" not in schema.get("pattern", "")
            if is_id:
                assert schema.get("pattern") == pattern, (method, path, p["name"], schema)
