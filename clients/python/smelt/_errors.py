"""The exceptions the client raises: one class per HTTP status smeltd answers with, each
carrying the fields of smeltd's (OpenAI's) error envelope, and the connection errors."""
from typing import Any, Mapping, Optional, Type

__all__ = [
    "SmeltError", "APIError", "APIStatusError", "BadRequestError", "AuthenticationError",
    "PermissionDeniedError", "NotFoundError", "MethodNotAllowedError", "ConflictError",
    "RequestTooLargeError", "UnprocessableEntityError", "RateLimitError", "InternalServerError",
    "APIConnectionError", "APITimeoutError", "WaitTimeoutError", "status_error",
]


class SmeltError(Exception):
    """The base of every exception this package raises."""


class APIError(SmeltError):
    """A request to smeltd that did not succeed.

    ``message`` is the server's message (or the client's, for a connection error);
    ``type``, ``param`` and ``code`` are the error envelope's fields when the server sent
    one (``param`` names the field at fault, e.g. ``method.supervised.hyperparameters.batch_size``).
    """

    message: str
    type: Optional[str]
    param: Optional[str]
    code: Optional[str]
    body: Any

    def __init__(self, message: str, *, type: Optional[str] = None, param: Optional[str] = None,
                 code: Optional[str] = None, body: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.body = body

    def __str__(self) -> str:
        return self.message if not self.param else "%s (param: %s)" % (self.message, self.param)


class APIStatusError(APIError):
    """smeltd answered with an error status; ``status_code`` is it, ``headers`` the answer's headers."""

    status_code: int
    headers: Mapping[str, str]

    def __init__(self, message: str, *, status_code: int, headers: Optional[Mapping[str, str]] = None,
                 type: Optional[str] = None, param: Optional[str] = None, code: Optional[str] = None,
                 body: Any = None) -> None:
        super().__init__(message, type=type, param=param, code=code, body=body)
        self.status_code = status_code
        self.headers = dict(headers or {})

    def __str__(self) -> str:
        return "%d %s" % (self.status_code, APIError.__str__(self))


class BadRequestError(APIStatusError):
    """400: bad JSON, a wrong type, an unknown field, a value out of range, an invalid file."""


class AuthenticationError(APIStatusError):
    """401: no key, or a key smeltd does not know (``code``: missing_api_key / invalid_api_key)."""


class PermissionDeniedError(APIStatusError):
    """403: an admin route called with a project key."""


class NotFoundError(APIStatusError):
    """404: no such object (or another project's), or an unknown route."""


class MethodNotAllowedError(APIStatusError):
    """405: a known path with a method it does not serve."""


class ConflictError(APIStatusError):
    """409: an illegal state change, a file in use, an Idempotency-Key reused for another body."""


class RequestTooLargeError(APIStatusError):
    """413: a body over the server's limit."""


class UnprocessableEntityError(APIStatusError):
    """422: the request was understood but cannot be processed (smeltd answers 400 for invalid
    requests today; the class is here for servers in front of it)."""


class RateLimitError(APIStatusError):
    """429: too many requests of a kind at once (a ``Retry-After`` header says when to retry)."""


class InternalServerError(APIStatusError):
    """5xx: the store or the disk failed, or a proxy in front of smeltd did."""


class APIConnectionError(APIError):
    """smeltd could not be reached, or the connection broke before the answer was read."""


class APITimeoutError(APIConnectionError):
    """The request timed out."""


class WaitTimeoutError(SmeltError, TimeoutError):
    """``jobs.wait`` gave up before the job ended; ``job`` is the job as last seen."""

    job: Any

    def __init__(self, message: str, job: Any = None) -> None:
        super().__init__(message)
        self.job = job


_BY_STATUS = {
    400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError, 404: NotFoundError,
    405: MethodNotAllowedError, 409: ConflictError, 413: RequestTooLargeError,
    422: UnprocessableEntityError, 429: RateLimitError,
}


def status_error(status: int, body: Any, headers: Optional[Mapping[str, str]] = None) -> APIStatusError:
    """The exception for an error answer: its class from the status, its fields from the
    envelope ``{"error": {"message", "type", "param", "code"}}`` when the body has one."""
    cls: Type[APIStatusError]
    if status >= 500:
        cls = InternalServerError
    else:
        cls = _BY_STATUS.get(status, APIStatusError)
    message, type_, param, code = None, None, None, None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        message = err.get("message")
        type_ = err.get("type")
        param = err.get("param")
        code = err.get("code")
    elif isinstance(err, str):
        message = err
    if not isinstance(message, str) or not message:
        text = body if isinstance(body, str) else ""
        message = ("HTTP %d: %s" % (status, text.strip()[:300])) if text.strip() else "HTTP %d" % status
    return cls(message, status_code=status, headers=headers,
               type=type_ if isinstance(type_, str) else None,
               param=param if isinstance(param, str) else None,
               code=code if isinstance(code, str) else None, body=body)
