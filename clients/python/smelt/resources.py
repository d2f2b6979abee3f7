"""The API's resources: files, fine-tuning jobs, models, schedules, the cluster, API keys
and graders. Each method is one route of smeltd (docs/api.md, /v1/openapi.json)."""
import io
import json
import mimetypes
import os
import time
import urllib.parse
import uuid
from typing import (IO, TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Set,
                    Union, cast)

from ._errors import APIConnectionError, APIStatusError, ConflictError, NotFoundError, WaitTimeoutError
from .methods import Method
from .pagination import Page
from .types import (TERMINAL_STATUSES, AgentCredential, ApiKey, ApiKeyCreated, ApiKeyDeleted, Checkpoint, Cluster,
                    FileDeleted, FileObject, Job, JobEvent, Lora, MetricsRow, Model, Resources, Schedule,
                    ScheduleDeleted, ScheduleRun)

from ._http import StreamIdle

if TYPE_CHECKING:  # pragma: no cover
    from ._http import Transport

__all__ = ["Files", "Jobs", "Models", "Schedules", "Cluster_", "AgentCredentials", "ApiKeys", "Graders",
           "ProgressCallback", "FileInput"]

ProgressCallback = Callable[[int, int], None]
"""Called as an upload goes with (bytes sent, bytes in all)."""

FileInput = Union[str, "os.PathLike[str]", bytes, IO[bytes]]
"""What files.upload takes: a path, the bytes, or a binary file object."""

UPLOAD_CHUNK = 256 * 1024


def _seg(value: str) -> str:
    """A path segment: an id quoted for the URL (smeltd's ids are A-Z a-z 0-9 . _ : -)."""
    return urllib.parse.quote(str(value), safe=":._-")


def _id_cursor(item: Any) -> Optional[str]:
    value = item.get("id") if isinstance(item, dict) else None
    return None if value is None else str(value)


def _page(transport: "Transport", path: str, query: Dict[str, Any]) -> "Page[Any]":
    body = transport.request("GET", path, query=query).parsed()

    def fetch(cursor: str) -> "Page[Any]":
        return _page(transport, path, dict(query, after=cursor))

    return Page(list(body.get("data") or []), bool(body.get("has_more")), fetch, _id_cursor, body)


class _Resource:
    def __init__(self, transport: "Transport") -> None:
        self._t = transport

    def _json(self, method: str, path: str, *, query: Optional[Mapping[str, Any]] = None, body: Any = None,
              retry_connection_errors: bool = True) -> Any:
        return self._t.request(method, path, query=query, json_body=body,
                               retry_connection_errors=retry_connection_errors).parsed()


# ---------------------------------------------------------------- files

class Files(_Resource):
    """``/v1/files``: uploads (validated at once: the file object's ``validation`` is the report)."""

    def upload(self, file: FileInput, *, purpose: str = "fine-tune", filename: Optional[str] = None,
               progress: Optional[ProgressCallback] = None) -> FileObject:
        """Uploads a file (a path, bytes or a binary file object) as multipart form data,
        calling ``progress(sent, total)`` as the bytes go. The answer is the file object
        with its validation report; a file with invalid rows is kept with ``status:
        "error"`` (see ``validation["errors"]``). Retried only on an answer saying the
        server did not act (429/5xx), not after a broken connection (a retry could store
        the file twice)."""
        opened: Optional[IO[bytes]] = None
        if isinstance(file, (str, os.PathLike)):
            path = os.fspath(file)
            opened = open(path, "rb")
            stream: IO[bytes] = opened
            name = filename or os.path.basename(path)
        elif isinstance(file, bytes):
            stream = io.BytesIO(file)
            name = filename or "upload.jsonl"
        else:
            stream = file
            name = filename or os.path.basename(str(getattr(file, "name", "") or "upload.jsonl"))
        try:
            start = stream.tell()
            stream.seek(0, os.SEEK_END)
            size = stream.tell() - start
            stream.seek(start)
            boundary = "smelt-" + uuid.uuid4().hex
            ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
            safe_name = name.replace("\\", "_").replace('"', "_").replace("\r", "_").replace("\n", "_")
            head = ("--%s\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n%s\r\n"
                    "--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"%s\"\r\n"
                    "Content-Type: %s\r\n\r\n" % (boundary, purpose, boundary, safe_name, ctype)).encode("utf-8")
            tail = ("\r\n--%s--\r\n" % boundary).encode("utf-8")
            total = len(head) + size + len(tail)

            def chunks() -> Iterable[bytes]:
                stream.seek(start)
                sent = 0
                yield head
                sent += len(head)
                if progress:
                    progress(sent, total)
                left = size
                while left > 0:
                    chunk = stream.read(min(UPLOAD_CHUNK, left))
                    if not chunk:
                        raise APIConnectionError("the file shrank while it was uploaded")
                    left -= len(chunk)
                    yield chunk
                    sent += len(chunk)
                    if progress:
                        progress(sent, total)
                yield tail
                if progress:
                    progress(total, total)

            resp = self._t.request("POST", "/v1/files", body=chunks, content_length=total,
                                   headers={"Content-Type": "multipart/form-data; boundary=" + boundary},
                                   retry_connection_errors=False)
            return cast(FileObject, resp.parsed())
        finally:
            if opened is not None:
                opened.close()

    def list(self, *, purpose: Optional[str] = None, limit: Optional[int] = None, after: Optional[str] = None,
             order: Optional[str] = None) -> "Page[FileObject]":
        """A page of the project's files (newest first, or ``order="asc"``); iterate it for all."""
        return cast("Page[FileObject]", _page(self._t, "/v1/files",
                                              {"purpose": purpose, "limit": limit, "after": after, "order": order}))

    def retrieve(self, file_id: str) -> FileObject:
        """The file object (with its validation report)."""
        return cast(FileObject, self._json("GET", "/v1/files/" + _seg(file_id)))

    def validation(self, file_id: str) -> Dict[str, Any]:
        """The file's validation report: ``{kind, lines, examples, blank_lines, errors_total,
        errors: [{line, field, message}]}`` (up to 20 errors)."""
        return dict(self.retrieve(file_id).get("validation") or {})

    def content(self, file_id: str) -> bytes:
        """The file's bytes."""
        return self._t.request("GET", "/v1/files/%s/content" % _seg(file_id)).raw

    def delete(self, file_id: str) -> FileDeleted:
        """Deletes the file (409 while a job that has not ended uses it)."""
        return cast(FileDeleted, self._json("DELETE", "/v1/files/" + _seg(file_id)))


# ---------------------------------------------------------------- jobs

class Jobs(_Resource):
    """``/v1/fine_tuning/jobs``: create (every method), list, follow and steer jobs."""

    def create(self, model: str, training_file: str, *, validation_file: Optional[str] = None,
               method: Optional[Union[Method, Mapping[str, Any]]] = None,
               hyperparameters: Optional[Mapping[str, Any]] = None, suffix: Optional[str] = None,
               seed: Optional[int] = None, metadata: Optional[Mapping[str, str]] = None,
               lora: Optional[Lora] = None, resources: Optional[Resources] = None, priority: Optional[int] = None,
               max_retries: Optional[int] = None, max_runtime_seconds: Optional[int] = None,
               model_init: Optional[str] = None, data: Optional[Mapping[str, Any]] = None,
               eval: Optional[Mapping[str, Any]] = None, checkpoint: Optional[Mapping[str, Any]] = None,
               save_merged: Optional[bool] = None, save_dtype: Optional[str] = None, backend: Optional[str] = None,
               chat_template: Optional[str] = None, extra_body: Optional[Mapping[str, Any]] = None,
               idempotency_key: Optional[str] = None) -> Job:
        """Creates a job (docs/api.md, Create). ``method`` is a block from smelt.methods
        (``supervised(...)``, ``dpo(...)``, ``reward_model(...)``, ``grpo(reward, ...)``,
        ``ppo(reward, ...)``, ``reinforcement(grader, ...)``); without it the job is
        supervised. ``max_retries`` here is the job's (restarts after a lost worker), not
        the client's. The request carries an ``Idempotency-Key`` (``idempotency_key``, or
        one made for this call) used for every retry, so a retried create makes one job."""
        body: Dict[str, Any] = {"model": model, "training_file": training_file}
        fields: Dict[str, Any] = {
            "validation_file": validation_file, "method": method, "hyperparameters": hyperparameters,
            "suffix": suffix, "seed": seed, "metadata": metadata, "lora": lora, "resources": resources,
            "priority": priority, "max_retries": max_retries, "max_runtime_seconds": max_runtime_seconds,
            "model_init": model_init, "data": data, "eval": eval, "checkpoint": checkpoint,
            "save_merged": save_merged, "save_dtype": save_dtype, "backend": backend, "chat_template": chat_template,
        }
        body.update({k: v for k, v in fields.items() if v is not None})
        body.update(extra_body or {})
        return self.create_from_spec(body, idempotency_key=idempotency_key)

    def create_from_spec(self, body: Mapping[str, Any], *, idempotency_key: Optional[str] = None) -> Job:
        """Creates a job from a whole request body (as ``smelt jobs create --spec FILE`` does),
        with an Idempotency-Key as ``create``."""
        key = idempotency_key or "smelt-py-" + uuid.uuid4().hex
        resp = self._t.request("POST", "/v1/fine_tuning/jobs", json_body=dict(body),
                               headers={"Idempotency-Key": key})
        return cast(Job, resp.parsed())

    def retrieve(self, job_id: str) -> Job:
        """The job object."""
        return cast(Job, self._json("GET", "/v1/fine_tuning/jobs/" + _seg(job_id)))

    def list(self, *, limit: Optional[int] = None, after: Optional[str] = None,
             status: Optional[str] = None) -> "Page[Job]":
        """A page of the project's jobs, newest first (``status`` filters); iterating the
        page walks every page (``after`` / ``has_more``)."""
        return cast("Page[Job]", _page(self._t, "/v1/fine_tuning/jobs",
                                       {"limit": limit, "after": after, "status": status}))

    def _change(self, job_id: str, action: str, reached: Set[str]) -> Job:
        retried: List[BaseException] = []
        try:
            resp = self._t.request("POST", "/v1/fine_tuning/jobs/%s/%s" % (_seg(job_id), action),
                                   on_retry=lambda _n, e: retried.append(e))
        except ConflictError:
            # after a broken connection the first try may have done it: then the job shows it
            if not any(isinstance(e, APIConnectionError) for e in retried):
                raise
            job = self.retrieve(job_id)
            if job.get("status") in reached:
                return job
            raise
        return cast(Job, resp.parsed())

    def cancel(self, job_id: str) -> Job:
        """Cancels a queued, paused or running job (409 once it has ended)."""
        return self._change(job_id, "cancel", {"cancelled"})

    def pause(self, job_id: str) -> Job:
        """Pauses a queued or running job (its worker checkpoints and exits)."""
        return self._change(job_id, "pause", {"paused"})

    def resume(self, job_id: str) -> Job:
        """Resumes a paused job: it is queued again and continues from its last checkpoint."""
        return self._change(job_id, "resume", {"queued", "running"})

    def events(self, job_id: str, *, limit: Optional[int] = None, after: Optional[str] = None) -> "Page[JobEvent]":
        """A page of the job's events, newest first (``after`` an event id); iterate for all."""
        return cast("Page[JobEvent]", _page(self._t, "/v1/fine_tuning/jobs/%s/events" % _seg(job_id),
                                            {"limit": limit, "after": after}))

    def stream_events(self, job_id: str, *, after: Optional[str] = None, read_timeout: Optional[float] = 30.0,
                      max_reconnects: Optional[int] = None,
                      on_reconnect: Optional[Callable[[int, BaseException], None]] = None) -> Iterator[JobEvent]:
        """The job's events as they happen, oldest first (Server-Sent Events), from the
        first (or the one after ``after``) until the job has ended and its worker is gone.
        A dropped connection is reopened with ``Last-Event-ID`` set to the last event
        received, so no event is lost or repeated; ``max_reconnects`` (default: the
        client's max_retries + 3) limits the failed connections in a row without an event
        between them. A stream quiet for ``read_timeout`` seconds is reopened the same way
        (not counted as a failure): smeltd sends a keep-alive comment every 15 s, so a
        read_timeout above that reopens only a stream that went dead.
        ``on_reconnect(failures, error)`` is called before each reopening."""
        last = after
        limit = self._t.max_retries + 3 if max_reconnects is None else max_reconnects
        failures = 0
        path = "/v1/fine_tuning/jobs/%s/events" % _seg(job_id)
        while True:
            try:
                for event_id, kind, data in self._t.sse(path, last_event_id=last, read_timeout=read_timeout):
                    if kind == "end":
                        return
                    if kind != "fine_tuning.job.event":
                        continue
                    event = cast(JobEvent, json.loads(data))
                    if event_id:
                        last = event_id
                    elif event.get("id"):
                        last = str(event.get("id"))
                    failures = 0
                    yield event
                error: BaseException = APIConnectionError("the event stream closed before its end")
            except StreamIdle as e:
                if on_reconnect:
                    on_reconnect(failures, e)
                continue
            except APIStatusError as e:
                if e.status_code not in (429, 500, 502, 503, 504):
                    raise
                error = e
            except APIConnectionError as e:
                error = e
            if failures >= limit:
                raise error if isinstance(error, APIConnectionError) else APIConnectionError(str(error))
            if on_reconnect:
                on_reconnect(failures, error)
            headers = error.headers if isinstance(error, APIStatusError) else None
            self._t.sleep(min(self._t.backoff(failures, headers), 2.0) if failures else 0.0)
            failures += 1

    def checkpoints(self, job_id: str, *, limit: Optional[int] = None,
                    after: Optional[str] = None) -> "Page[Checkpoint]":
        """A page of the job's checkpoints, newest step first."""
        return cast("Page[Checkpoint]", _page(self._t, "/v1/fine_tuning/jobs/%s/checkpoints" % _seg(job_id),
                                              {"limit": limit, "after": after}))

    def metrics(self, job_id: str, *, limit: Optional[int] = None,
                after: Optional[int] = None) -> "Page[MetricsRow]":
        """A page of the trainer's metrics lines, oldest first (``after`` a row id)."""
        return cast("Page[MetricsRow]", _page(self._t, "/v1/fine_tuning/jobs/%s/metrics" % _seg(job_id),
                                              {"limit": limit, "after": after}))

    def logs(self, job_id: str, *, tail: Optional[int] = None) -> str:
        """The end of the worker's stdout and stderr (``tail`` bytes; the server's default 64 KiB)."""
        resp = self._t.request("GET", "/v1/fine_tuning/jobs/%s/logs" % _seg(job_id), query={"tail": tail})
        return resp.raw.decode("utf-8", "replace")

    def wait(self, job_id: str, *, timeout: Optional[float] = None, poll_interval: float = 1.0,
             statuses: Iterable[str] = TERMINAL_STATUSES) -> Job:
        """Polls the job until its status is one of ``statuses`` (by default: it has ended)
        and returns it; raises WaitTimeoutError after ``timeout`` seconds (None: no limit)."""
        wanted = set(statuses)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.retrieve(job_id)
            if job.get("status") in wanted:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError("job %s is still %s after %s s" % (job_id, job.get("status"), timeout), job)
            pause = poll_interval if deadline is None else max(0.0, min(poll_interval, deadline - time.monotonic()))
            time.sleep(pause)


# ---------------------------------------------------------------- models

class Models(_Resource):
    """``/v1/models``: the base models and the project's job outputs."""

    def list(self) -> "Page[Model]":
        """Every model (one page: the route is not paginated)."""
        body = self._json("GET", "/v1/models")
        return Page(list(body.get("data") or []), False, None, _id_cursor, body)

    def retrieve(self, model: str) -> Model:
        """One model."""
        return cast(Model, self._json("GET", "/v1/models/" + _seg(model)))


# ---------------------------------------------------------------- schedules

class Schedules(_Resource):
    """``/v1/fine_tuning/schedules`` (smelt): cron schedules that create jobs."""

    def create(self, cron: str, job: Mapping[str, Any], *, name: Optional[str] = None,
               concurrency_policy: Optional[str] = None, suspended: Optional[bool] = None) -> Schedule:
        """A schedule firing ``job`` (a job create body) at ``cron`` (five fields, UTC, or
        ``@hourly``-style); ``concurrency_policy``: allow, forbid or replace."""
        body: Dict[str, Any] = {"cron": cron, "job": dict(job)}
        for k, v in (("name", name), ("concurrency_policy", concurrency_policy), ("suspended", suspended)):
            if v is not None:
                body[k] = v
        return cast(Schedule, self._json("POST", "/v1/fine_tuning/schedules", body=body,
                                         retry_connection_errors=False))

    def list(self, *, limit: Optional[int] = None, after: Optional[str] = None) -> "Page[Schedule]":
        """A page of the project's schedules, oldest first; iterate for all."""
        return cast("Page[Schedule]", _page(self._t, "/v1/fine_tuning/schedules", {"limit": limit, "after": after}))

    def retrieve(self, schedule_id: str) -> Schedule:
        """One schedule."""
        return cast(Schedule, self._json("GET", "/v1/fine_tuning/schedules/" + _seg(schedule_id)))

    def update(self, schedule_id: str, **fields: Any) -> Schedule:
        """Changes any of name, cron, job, concurrency_policy, suspended."""
        return cast(Schedule, self._json("POST", "/v1/fine_tuning/schedules/" + _seg(schedule_id), body=fields))

    def delete(self, schedule_id: str) -> ScheduleDeleted:
        """Deletes the schedule."""
        return cast(ScheduleDeleted, self._json("DELETE", "/v1/fine_tuning/schedules/" + _seg(schedule_id)))

    def trigger(self, schedule_id: str) -> ScheduleRun:
        """Fires the schedule now; the answer is the run (its ``job_id``, ``outcome``)."""
        return cast(ScheduleRun, self._json("POST", "/v1/fine_tuning/schedules/%s/trigger" % _seg(schedule_id),
                                            retry_connection_errors=False))

    def runs(self, schedule_id: str, *, limit: Optional[int] = None,
             after: Optional[int] = None) -> "Page[ScheduleRun]":
        """A page of the schedule's runs, newest first."""
        return cast("Page[ScheduleRun]", _page(self._t, "/v1/fine_tuning/schedules/%s/runs" % _seg(schedule_id),
                                               {"limit": limit, "after": after}))


# ---------------------------------------------------------------- cluster

class AgentCredentials(_Resource):
    """``/v1/cluster/agent_credentials`` (admin keys): remote agents' enrollment."""

    def create(self, agent_id: str, *, description: Optional[str] = None) -> AgentCredential:
        """A new credential; its ``key_file`` (with the secret key) is shown only here."""
        body: Dict[str, Any] = {"agent_id": agent_id}
        if description is not None:
            body["description"] = description
        return cast(AgentCredential, self._json("POST", "/v1/cluster/agent_credentials", body=body,
                                                retry_connection_errors=False))

    def list(self) -> List[AgentCredential]:
        """Every credential (no secrets)."""
        return cast(List[AgentCredential], self._json("GET", "/v1/cluster/agent_credentials").get("data") or [])

    def revoke(self, credential_id: str) -> AgentCredential:
        """Revokes it: the agent connected with it is lost at once."""
        return cast(AgentCredential, self._json("POST", "/v1/cluster/agent_credentials/%s/revoke"
                                                % _seg(credential_id), retry_connection_errors=False))

    def rotate(self, credential_id: str) -> AgentCredential:
        """A new credential for the same agent (with ``key_file``), the old one revoked."""
        return cast(AgentCredential, self._json("POST", "/v1/cluster/agent_credentials/%s/rotate"
                                                % _seg(credential_id), retry_connection_errors=False))


class Cluster_(_Resource):
    """``/v1/cluster`` (smelt): agents, their devices, the queue."""

    def __init__(self, transport: "Transport") -> None:
        super().__init__(transport)
        self.agent_credentials = AgentCredentials(transport)

    def retrieve(self) -> Cluster:
        """Agents (devices, states), the queue and the agents' security mode."""
        return cast(Cluster, self._json("GET", "/v1/cluster"))


# ---------------------------------------------------------------- keys

class ApiKeys(_Resource):
    """``/v1/api_keys`` (admin keys): keys and projects."""

    def create(self, project: str, *, name: Optional[str] = None, admin: Optional[bool] = None) -> ApiKeyCreated:
        """A new key of ``project`` (made if new); the key's text is in the answer only."""
        body: Dict[str, Any] = {"project": project}
        if name is not None:
            body["name"] = name
        if admin is not None:
            body["admin"] = admin
        return cast(ApiKeyCreated, self._json("POST", "/v1/api_keys", body=body, retry_connection_errors=False))

    def list(self) -> List[ApiKey]:
        """Every key (prefix, project, admin, revoked), never their text."""
        return cast(List[ApiKey], self._json("GET", "/v1/api_keys").get("data") or [])

    def revoke(self, key_id: Union[int, str]) -> ApiKeyDeleted:
        """Revokes a key (a key cannot revoke itself: 409)."""
        return cast(ApiKeyDeleted, self._json("DELETE", "/v1/api_keys/" + _seg(str(key_id))))


# ---------------------------------------------------------------- graders

class Graders(_Resource):
    """``/v1/fine_tuning/alpha/graders``: check a grader and try it on a sample."""

    def validate(self, grader: Mapping[str, Any]) -> Dict[str, Any]:
        """``{"grader": ...}`` as smelt reads it, defaults filled in."""
        return cast(Dict[str, Any], self._json("POST", "/v1/fine_tuning/alpha/graders/validate",
                                               body={"grader": dict(grader)}))

    def run(self, grader: Mapping[str, Any], model_sample: str,
            item: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Scores ``model_sample`` against ``item``: ``{reward, metadata, sub_rewards, ...}``."""
        body: Dict[str, Any] = {"grader": dict(grader), "model_sample": model_sample}
        if item is not None:
            body["item"] = dict(item)
        return cast(Dict[str, Any], self._json("POST", "/v1/fine_tuning/alpha/graders/run", body=body))
