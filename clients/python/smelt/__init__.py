"""smelt: the Python client of smeltd, smelt's fine-tuning and RLHF service.

>>> import smelt
>>> client = smelt.Client()          # $SMELT_BASE_URL / $SMELT_API_KEY, else make run's defaults
>>> f = client.files.upload("examples/data/addition_train.jsonl")
>>> job = client.jobs.create("tiny", f["id"], model_init="random", data={"max_seq_len": 32},
...                          method=smelt.supervised(n_epochs=1, batch_size=16))
>>> for event in client.jobs.stream_events(job["id"]): print(event["message"])

Only the standard library is used. The ``smelt`` command (smelt.cli) wraps the same calls.
"""
from ._errors import (APIConnectionError, APIError, APIStatusError, APITimeoutError, AuthenticationError,
                      BadRequestError, ConflictError, InternalServerError, MethodNotAllowedError, NotFoundError,
                      PermissionDeniedError, RateLimitError, RequestTooLargeError, SmeltError,
                      UnprocessableEntityError, WaitTimeoutError)
from ._version import __version__
from .client import DEFAULT_BASE_URL, DEFAULT_KEY_FILE, Client
from .methods import (METHOD_TYPES, DpoMethod, GrpoMethod, Method, PpoMethod, ReinforcementMethod, RewardModelMethod,
                      SupervisedMethod, dpo, grpo, ppo, reinforcement, reward_model, supervised)
from .pagination import Page
from .types import TERMINAL_STATUSES, FileObject, Job, JobEvent

__all__ = [
    "__version__", "Client", "DEFAULT_BASE_URL", "DEFAULT_KEY_FILE", "Page",
    "SmeltError", "APIError", "APIStatusError", "BadRequestError", "AuthenticationError", "PermissionDeniedError",
    "NotFoundError", "MethodNotAllowedError", "ConflictError", "RequestTooLargeError", "UnprocessableEntityError",
    "RateLimitError", "InternalServerError", "APIConnectionError", "APITimeoutError", "WaitTimeoutError",
    "METHOD_TYPES", "Method", "SupervisedMethod", "DpoMethod", "RewardModelMethod", "GrpoMethod", "PpoMethod",
    "ReinforcementMethod", "supervised", "dpo", "reward_model", "grpo", "ppo", "reinforcement",
    "TERMINAL_STATUSES", "FileObject", "Job", "JobEvent",
]
