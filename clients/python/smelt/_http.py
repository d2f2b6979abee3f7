"""The HTTP transport: one connection per request (http.client), JSON in and out, the
error envelope turned into exceptions, retries with exponential backoff honouring
Retry-After, and a Server-Sent Events reader."""
import email.utils
import http.client
import json
import random
import socket
import ssl
import time
import urllib.parse
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from ._errors import APIConnectionError, APIStatusError, APITimeoutError, status_error
from ._version import __version__

__all__ = ["Transport", "Response", "BodyFactory", "RETRY_STATUSES", "StreamIdle"]


class StreamIdle(APITimeoutError):
    """An open event stream stayed quiet for its read timeout (reopening it loses nothing)."""

# A body sent as chunks; called again for each attempt (a retry sends the body again).
BodyFactory = Callable[[], Iterable[bytes]]

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
MAX_BACKOFF_S = 8.0
MAX_RETRY_AFTER_S = 60.0


class Response:
    """A finished answer: status, headers and body (parsed JSON when it is JSON)."""

    def __init__(self, status: int, headers: Dict[str, str], raw: bytes) -> None:
        self.status = status
        self.headers = headers
        self.raw = raw

    @property
    def content_type(self) -> str:
        """The Content-Type header, lower case."""
        return self.headers.get("content-type", "").lower()

    def parsed(self) -> Any:
        """The body as JSON when the Content-Type says JSON, else as text."""
        if "json" in self.content_type:
            try:
                return json.loads(self.raw.decode("utf-8"))
            except ValueError:
                pass
        return self.raw.decode("utf-8", "replace")


def retry_after_seconds(headers: Mapping[str, str]) -> Optional[float]:
    """Retry-After as seconds (a number, or an HTTP date), None when absent or unreadable."""
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


class Transport:
    """Sends requests to one smeltd."""

    def __init__(self, base_url: str, api_key: Optional[str], timeout: float, max_retries: int,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        url = urllib.parse.urlsplit(base_url.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError("base_url: http://HOST:PORT or https://HOST:PORT is expected, got %r" % base_url)
        self.scheme = url.scheme
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        prefix = url.path.rstrip("/")
        if prefix.endswith("/v1"):  # an OpenAI-style base URL: the routes below add /v1 themselves
            prefix = prefix[:-3]
        self.prefix = prefix
        self.base_url = "%s://%s%s" % (url.scheme, url.netloc, prefix)
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max(0, int(max_retries))
        self.sleep = sleep

    # ---- one attempt ----

    def connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        """A new connection to the server (not yet opened)."""
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def url_path(self, path: str, query: Optional[Mapping[str, Any]]) -> str:
        """The request target: prefix, path and the query's non-None values."""
        target = self.prefix + path
        if query:
            items = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items()
                     if v is not None]
            if items:
                target += "?" + urllib.parse.urlencode(items)
        return target

    def headers(self, extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
        """The headers every request carries, then extra."""
        h = {"User-Agent": "smelt-python/" + __version__, "Accept": "application/json"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        h.update(extra or {})
        return h

    def open(self, method: str, path: str, *, query: Optional[Mapping[str, Any]] = None,
             body: Union[None, bytes, BodyFactory] = None, headers: Optional[Mapping[str, str]] = None,
             timeout: Optional[float] = None, content_length: Optional[int] = None
             ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Sends one request and returns the connection and its answer's head (the body is
        still to be read). Raises APIConnectionError / APITimeoutError."""
        conn = self.connect(self.timeout if timeout is None else timeout)
        hdrs = self.headers(headers)
        try:
            try:
                if body is None or isinstance(body, bytes):
                    conn.request(method, self.url_path(path, query), body=body, headers=hdrs)
                else:
                    conn.putrequest(method, self.url_path(path, query), skip_accept_encoding=True)
                    if content_length is not None:
                        hdrs["Content-Length"] = str(content_length)
                    for k, v in hdrs.items():
                        conn.putheader(k, v)
                    conn.endheaders()
                    for chunk in body():
                        conn.send(chunk)
            except (BrokenPipeError, ConnectionResetError) as send_error:
                # the server may have answered early (413 for a body over its limit) and
                # closed: its answer is still there to read
                try:
                    resp = conn.getresponse()
                except (OSError, http.client.HTTPException):
                    raise send_error from None
                return conn, resp
            resp = conn.getresponse()
        except socket.timeout as e:
            conn.close()
            raise APITimeoutError("request timed out: %s %s" % (method, path)) from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise APIConnectionError("connection to %s failed: %s: %s" % (self.base_url, type(e).__name__, e)) from e
        return conn, resp

    def once(self, method: str, path: str, *, query: Optional[Mapping[str, Any]] = None,
             body: Union[None, bytes, BodyFactory] = None, headers: Optional[Mapping[str, str]] = None,
             content_length: Optional[int] = None) -> Response:
        """One attempt, its answer read in full (any status)."""
        conn, resp = self.open(method, path, query=query, body=body, headers=headers, content_length=content_length)
        try:
            raw = resp.read()
        except socket.timeout as e:
            raise APITimeoutError("reading the answer timed out: %s %s" % (method, path)) from e
        except (OSError, http.client.HTTPException) as e:
            raise APIConnectionError("the connection broke while reading the answer to %s %s: %s: %s"
                                     % (method, path, type(e).__name__, e)) from e
        finally:
            conn.close()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw)

    # ---- retries ----

    def backoff(self, attempt: int, headers: Optional[Mapping[str, str]]) -> float:
        """Seconds to wait before retry number attempt+1: the server's Retry-After when it
        sent one (capped at a minute), else 0.5 s doubling per attempt (at most 8 s), jittered."""
        if headers is not None:
            after = retry_after_seconds(headers)
            if after is not None:
                return min(after, MAX_RETRY_AFTER_S)
        return min(MAX_BACKOFF_S, 0.5 * (2.0 ** attempt)) * random.uniform(0.75, 1.0)

    def request(self, method: str, path: str, *, query: Optional[Mapping[str, Any]] = None,
                json_body: Any = None, body: Union[None, bytes, BodyFactory] = None,
                headers: Optional[Mapping[str, str]] = None, content_length: Optional[int] = None,
                retry_connection_errors: bool = True,
                on_retry: Optional[Callable[[int, BaseException], None]] = None) -> Response:
        """The answer to a request, retried on 408/429/5xx answers (always: the server did not
        act on them) and on connection errors (when retry_connection_errors: the request may
        have been acted on, so only requests that are safe to repeat). Error statuses raise
        the APIStatusError subclass of their status."""
        hdrs = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body).encode("utf-8")
            hdrs.setdefault("Content-Type", "application/json")
        attempt = 0
        while True:
            try:
                resp = self.once(method, path, query=query, body=body, headers=hdrs, content_length=content_length)
            except APIConnectionError as e:
                if not retry_connection_errors or attempt >= self.max_retries:
                    raise
                if on_retry:
                    on_retry(attempt, e)
                self.sleep(self.backoff(attempt, None))
                attempt += 1
                continue
            if resp.status < 400:
                return resp
            err = status_error(resp.status, resp.parsed(), resp.headers)
            if resp.status in RETRY_STATUSES and attempt < self.max_retries:
                if on_retry:
                    on_retry(attempt, err)
                self.sleep(self.backoff(attempt, resp.headers))
                attempt += 1
                continue
            raise err

    # ---- Server-Sent Events ----

    def sse(self, path: str, *, last_event_id: Optional[str], query: Optional[Mapping[str, Any]] = None,
            read_timeout: Optional[float] = None) -> Iterator[Tuple[Optional[str], str, str]]:
        """One connection's events, as (id, event, data) records, until the server closes
        it. Raises APIStatusError for an error answer and APIConnectionError when the
        connection breaks or is not answered; a record cut off by a broken connection is
        never yielded."""
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        conn, resp = self.open("GET", path, query=query, headers=headers, timeout=read_timeout)
        try:
            if resp.status >= 400:
                raw = resp.read()
                r = Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw)
                raise status_error(r.status, r.parsed(), r.headers)
            event_id: Optional[str] = None
            event = "message"
            data: List[str] = []
            while True:
                try:
                    line_b = resp.readline()
                except socket.timeout as e:
                    raise StreamIdle("no data on the event stream for %s s" % read_timeout) from e
                except (OSError, http.client.HTTPException) as e:
                    raise APIConnectionError("the event stream broke: %s: %s" % (type(e).__name__, e)) from e
                if not line_b:
                    return  # closed by the server (or cut)
                if not line_b.endswith(b"\n"):
                    raise APIConnectionError("the event stream broke in the middle of a line")
                line = line_b.decode("utf-8", "replace").rstrip("\r\n")
                if line == "":
                    if data or event != "message":
                        yield event_id, event, "\n".join(data)
                    event, data = "message", []
                    continue
                if line.startswith(":"):
                    continue
                field, _, value = line.partition(":")
                if value.startswith(" "):
                    value = value[1:]
                if field == "data":
                    data.append(value)
                elif field == "event":
                    event = value
                elif field == "id":
                    event_id = value
        finally:
            conn.close()


def raise_for(resp: Response) -> None:
    """Raises the error of an error answer (used where a status is checked by hand)."""
    if resp.status >= 400:
        raise status_error(resp.status, resp.parsed(), resp.headers)


