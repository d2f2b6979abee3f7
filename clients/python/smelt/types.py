"""The shapes of smeltd's objects (docs/api.md, /v1/openapi.json) as TypedDicts. They are
plain dicts at run time; every key is optional to the type checker, since smeltd adds
fields over time and some are present only in some states."""
from typing import Any, Dict, List, Literal, Optional, TypedDict, Union

__all__ = [
    "JobStatus", "TERMINAL_STATUSES", "ValidationIssue", "ValidationReport", "FileObject", "FileDeleted",
    "JobError", "Job", "JobEvent", "Checkpoint", "MetricsRow", "Model", "Schedule", "ScheduleRun",
    "ScheduleDeleted", "Device", "Agent", "QueueEntry", "Cluster", "ApiKey", "ApiKeyCreated", "ApiKeyDeleted",
    "AgentCredential", "Lora", "Resources", "JobCreateParams",
]

JobStatus = Literal["validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused"]
"""A job's status; succeeded, failed and cancelled are final."""

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
"""The statuses a job never leaves."""


class ValidationIssue(TypedDict, total=False):
    """One invalid row of an upload."""
    line: int
    field: str
    message: str


class ValidationReport(TypedDict, total=False):
    """The row-by-row check of an upload (part of the file object)."""
    kind: str
    lines: int
    examples: int
    blank_lines: int
    errors_total: int
    errors: List[ValidationIssue]


class FileObject(TypedDict, total=False):
    """A file (``object: "file"``)."""
    id: str
    object: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str
    status_details: Optional[str]
    expires_at: Optional[int]
    validation: ValidationReport


class FileDeleted(TypedDict, total=False):
    """The answer to a file's deletion."""
    id: str
    object: str
    deleted: bool


class JobError(TypedDict, total=False):
    """Why a job failed."""
    code: str
    message: str
    param: Optional[str]


class Job(TypedDict, total=False):
    """A fine-tuning job (``object: "fine_tuning.job"``): OpenAI's fields and smelt's."""
    object: str
    id: str
    model: str
    created_at: int
    started_at: Optional[int]
    finished_at: Optional[int]
    fine_tuned_model: Optional[str]
    organization_id: str
    status: str
    training_file: str
    validation_file: Optional[str]
    hyperparameters: Dict[str, Any]
    method: Dict[str, Any]
    trained_tokens: Optional[int]
    error: Optional[JobError]
    user_provided_suffix: Optional[str]
    seed: int
    metadata: Optional[Dict[str, str]]
    result_files: List[str]
    integrations: List[Any]
    estimated_finish: Optional[int]
    lora: Optional[Dict[str, Any]]
    resources: Dict[str, Any]
    priority: int
    max_retries: int
    max_runtime_seconds: int
    retries: int
    attempt: int
    agent: Optional[str]
    devices: Optional[List[Any]]
    schedule_id: Optional[str]
    spec: Dict[str, Any]


class JobEvent(TypedDict, total=False):
    """A job's event (``object: "fine_tuning.job.event"``, id ``ftevent-N``). Training steps
    are ``type: "metrics"`` events whose data holds step, total_steps, train_loss, ...
    (RL jobs: reward, ...)."""
    object: str
    id: str
    created_at: int
    level: str
    type: str
    message: str
    data: Optional[Dict[str, Any]]


class Checkpoint(TypedDict, total=False):
    """A job's checkpoint (``object: "fine_tuning.job.checkpoint"``)."""
    object: str
    id: str
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    step_number: int
    metrics: Optional[Dict[str, Any]]


class MetricsRow(TypedDict, total=False):
    """One line of the trainer's metrics.jsonl (smelt)."""
    id: int
    attempt: int
    step: int
    type: str
    data: Dict[str, Any]


class Model(TypedDict, total=False):
    """A model: a base model (``kind: "base"``) or a job's output (``"full"``, ``"lora"``)."""
    id: str
    object: str
    created: int
    owned_by: str
    kind: str
    head: str
    base_model: str
    fine_tuning_job_id: str


class Schedule(TypedDict, total=False):
    """A cron schedule of jobs (``object: "fine_tuning.schedule"``, smelt)."""
    id: str
    object: str
    name: Optional[str]
    cron: str
    job: Dict[str, Any]
    concurrency_policy: str
    suspended: bool
    next_run_at: Optional[int]
    last_run_at: Optional[int]
    created_at: int


class ScheduleRun(TypedDict, total=False):
    """A schedule's firing."""
    id: int
    object: str
    schedule_id: str
    scheduled_for: Optional[int]
    fired_at: int
    trigger: str
    job_id: Optional[str]
    outcome: str
    message: Optional[str]


class ScheduleDeleted(TypedDict, total=False):
    """The answer to a schedule's deletion."""
    id: str
    object: str
    deleted: bool


class Device(TypedDict, total=False):
    """A device of an agent."""
    index: int
    kind: str
    name: str
    memory_bytes: int
    state: str
    job_id: Optional[str]


class Agent(TypedDict, total=False):
    """An agent (a machine running jobs)."""
    id: str
    hostname: str
    status: str
    registered_at: int
    last_seen: int
    devices: List[Device]
    free_devices: int


class QueueEntry(TypedDict, total=False):
    """A queued job's place."""
    job_id: Optional[str]
    position: int
    priority: int
    devices_wanted: int
    waiting_seconds: float
    reason: Optional[str]


class Cluster(TypedDict, total=False):
    """``GET /v1/cluster``: agents, devices and the queue."""
    object: str
    agents: List[Agent]
    queue: List[QueueEntry]
    agents_security: str


class ApiKey(TypedDict, total=False):
    """An API key as listed (never its text); ``admin`` and ``revoked`` are 0 or 1."""
    id: int
    prefix: str
    project: str
    name: Optional[str]
    admin: int
    revoked: int
    created_at: int


class ApiKeyCreated(TypedDict, total=False):
    """A new API key: ``key`` is its text, shown only in this answer."""
    object: str
    id: int
    key: str
    project: str
    name: Optional[str]
    admin: bool


class ApiKeyDeleted(TypedDict, total=False):
    """The answer to a key's revocation."""
    object: str
    id: int
    deleted: bool


class AgentCredential(TypedDict, total=False):
    """An agent's enrollment credential (``key_file`` only when created or rotated)."""
    object: str
    id: str
    agent_id: str
    description: Optional[str]
    public_key: str
    created_at: int
    revoked_at: Optional[int]
    live: bool
    key_file: Dict[str, Any]


class Lora(TypedDict, total=False):
    """Train a LoRA adapter instead of the whole model."""
    rank: int
    alpha: float
    dropout: float
    target_modules: Union[str, List[str]]
    use_rslora: bool


class Resources(TypedDict, total=False):
    """Devices for a job: ``{"devices": N}`` or ``{"trainer": {"devices": N}, "rollout": {"devices": R}}``."""
    devices: int
    trainer: Dict[str, int]
    rollout: Dict[str, int]


class JobCreateParams(TypedDict, total=False):
    """The body of ``POST /v1/fine_tuning/jobs`` (docs/api.md); ``model`` and
    ``training_file`` are required."""
    model: str
    training_file: str
    validation_file: str
    method: Dict[str, Any]
    hyperparameters: Dict[str, Any]
    suffix: str
    seed: int
    metadata: Dict[str, str]
    integrations: List[Any]
    lora: Lora
    resources: Resources
    priority: int
    max_retries: int
    max_runtime_seconds: int
    model_init: str
    data: Dict[str, Any]
    eval: Dict[str, Any]
    checkpoint: Dict[str, Any]
    save_merged: bool
    save_dtype: str
    backend: str
    chat_template: str
