"""The client: one smeltd, its key, and the API's resources."""
import os
from typing import Any, Dict, Optional

from ._http import Transport
from .resources import ApiKeys, Cluster_, Files, Graders, Jobs, Models, Schedules

__all__ = ["Client", "DEFAULT_BASE_URL", "DEFAULT_KEY_FILE", "DEFAULT_TIMEOUT", "DEFAULT_MAX_RETRIES",
           "default_api_key"]

DEFAULT_BASE_URL = "http://127.0.0.1:8700"
"""Where ``make run`` (smeltd with no flags) serves."""

DEFAULT_KEY_FILE = os.path.join("var", "admin_key")
"""Where ``make run`` (smeltd --data var) writes the admin key at its first start."""

DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 2


def default_api_key() -> Optional[str]:
    """$SMELT_API_KEY, else the contents of ./var/admin_key when it can be read, else None."""
    key = os.environ.get("SMELT_API_KEY")
    if key:
        return key.strip()
    try:
        with open(DEFAULT_KEY_FILE, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError:
        return None
    return text or None


class Client:
    """A client of one smeltd.

    ``base_url`` defaults to $SMELT_BASE_URL, else http://127.0.0.1:8700 (an OpenAI-style
    URL ending in ``/v1`` is accepted too); ``api_key`` to $SMELT_API_KEY, else the
    contents of ./var/admin_key (what ``make run`` writes). ``timeout`` is seconds per
    request; ``max_retries`` how often a request is retried after a 408, 429 or 5xx
    answer or a broken connection (with exponential backoff, or the server's Retry-After).

    Resources: ``files``, ``jobs`` (alias ``fine_tuning_jobs``), ``models``, ``schedules``,
    ``cluster`` (and ``cluster.agent_credentials``), ``api_keys``, ``graders``.
    """

    def __init__(self, base_url: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: float = DEFAULT_TIMEOUT, max_retries: int = DEFAULT_MAX_RETRIES) -> None:
        url = base_url or os.environ.get("SMELT_BASE_URL") or DEFAULT_BASE_URL
        key = api_key if api_key is not None else default_api_key()
        self._transport = Transport(url, key, timeout, max_retries)
        self.files = Files(self._transport)
        self.jobs = Jobs(self._transport)
        self.fine_tuning_jobs = self.jobs
        self.models = Models(self._transport)
        self.schedules = Schedules(self._transport)
        self.cluster = Cluster_(self._transport)
        self.api_keys = ApiKeys(self._transport)
        self.graders = Graders(self._transport)

    @property
    def base_url(self) -> str:
        """The server's URL (without ``/v1``)."""
        return self._transport.base_url

    @property
    def api_key(self) -> Optional[str]:
        """The key the requests carry."""
        return self._transport.api_key

    @property
    def max_retries(self) -> int:
        """Retries per request."""
        return self._transport.max_retries

    @property
    def timeout(self) -> float:
        """Seconds per request."""
        return self._transport.timeout

    def health(self) -> Dict[str, Any]:
        """``GET /healthz``: ``{"status": "ok", "uptime_seconds"}`` (no key needed)."""
        body: Dict[str, Any] = self._transport.request("GET", "/healthz").parsed()
        return body

    def prometheus_metrics(self) -> str:
        """``GET /metrics``: the server's Prometheus text."""
        return self._transport.request("GET", "/metrics").raw.decode("utf-8", "replace")

    def openapi(self) -> Dict[str, Any]:
        """``GET /v1/openapi.json``: the API's OpenAPI 3.1 document."""
        body: Dict[str, Any] = self._transport.request("GET", "/v1/openapi.json").parsed()
        return body

    def __repr__(self) -> str:
        return "Client(base_url=%r)" % self.base_url
