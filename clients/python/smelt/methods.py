"""Helpers that build a job's ``method`` block, one per method smeltd runs (docs/api.md):

>>> supervised(n_epochs=1, batch_size=16, learning_rate=0.003)
{'type': 'supervised', 'supervised': {'hyperparameters': {'n_epochs': 1, 'batch_size': 16, 'learning_rate': 0.003}}}

OpenAI's names (``n_epochs``, ``batch_size``, ``learning_rate_multiplier``) are keyword
arguments; any other hyperparameter of the trainer (docs/job-spec.md) is passed by its own
name and reaches the server as given: the server judges every name and value, and an
error names the field (``method.dpo.hyperparameters.beta``)."""
from typing import Any, Dict, Literal, Mapping, Optional, TypedDict, Union

__all__ = [
    "Hyperparameters", "RewardSpec", "Grader", "MethodBlock", "RLMethodBlock", "ReinforcementBlock",
    "SupervisedMethod", "DpoMethod", "RewardModelMethod", "GrpoMethod", "PpoMethod", "ReinforcementMethod",
    "Method", "METHOD_TYPES", "supervised", "dpo", "reward_model", "grpo", "ppo", "reinforcement",
]

Hyperparameters = Dict[str, Any]
"""A method's hyperparameters: OpenAI's names and the trainer's, values numbers, strings,
booleans or "auto"."""

RewardSpec = Dict[str, Any]
"""A reward spec (docs/rewards.md): ``{"verifiers": [...]}`` or ``{"grader": {...}}``."""

Grader = Dict[str, Any]
"""An OpenAI-style grader (string_check, text_similarity, python, multi, ...; docs/rewards.md)."""

AutoOr = Union[int, float, Literal["auto"]]

METHOD_TYPES = ("supervised", "dpo", "reward_model", "grpo", "ppo", "reinforcement")
"""Every method type a job can be created with."""


class MethodBlock(TypedDict, total=False):
    """The settings of a supervised, dpo or reward_model method."""
    hyperparameters: Hyperparameters


class RLMethodBlock(TypedDict, total=False):
    """The settings of a grpo or ppo method: hyperparameters and the reward spec."""
    hyperparameters: Hyperparameters
    reward: RewardSpec


class ReinforcementBlock(TypedDict, total=False):
    """The settings of OpenAI's reinforcement method: the grader and hyperparameters."""
    grader: Grader
    hyperparameters: Hyperparameters


class SupervisedMethod(TypedDict):
    """``{"type": "supervised", "supervised": {...}}``: SFT rows."""
    type: Literal["supervised"]
    supervised: MethodBlock


class DpoMethod(TypedDict):
    """``{"type": "dpo", "dpo": {...}}``: preference rows."""
    type: Literal["dpo"]
    dpo: MethodBlock


class RewardModelMethod(TypedDict):
    """``{"type": "reward_model", "reward_model": {...}}`` (smelt): preference rows."""
    type: Literal["reward_model"]
    reward_model: MethodBlock


class GrpoMethod(TypedDict):
    """``{"type": "grpo", "grpo": {...}}`` (smelt): prompts rows."""
    type: Literal["grpo"]
    grpo: RLMethodBlock


class PpoMethod(TypedDict):
    """``{"type": "ppo", "ppo": {...}}`` (smelt): prompts rows."""
    type: Literal["ppo"]
    ppo: RLMethodBlock


class ReinforcementMethod(TypedDict):
    """``{"type": "reinforcement", "reinforcement": {...}}``: OpenAI's RFT, prompts rows."""
    type: Literal["reinforcement"]
    reinforcement: ReinforcementBlock


Method = Union[SupervisedMethod, DpoMethod, RewardModelMethod, GrpoMethod, PpoMethod, ReinforcementMethod]
"""A job's ``method`` block."""


def _hp(named: Mapping[str, Optional[Any]], extra: Mapping[str, Any]) -> Hyperparameters:
    out: Hyperparameters = {k: v for k, v in named.items() if v is not None}
    for k, v in extra.items():
        if k in out:
            raise TypeError("hyperparameter %r given twice" % k)
        out[k] = v
    return out


def supervised(*, n_epochs: Optional[AutoOr] = None, batch_size: Optional[AutoOr] = None,
               learning_rate_multiplier: Optional[AutoOr] = None, **hyperparameters: Any) -> SupervisedMethod:
    """A supervised fine-tuning method block; ``hyperparameters`` are the trainer's by name
    (``learning_rate``, ``max_steps``, ``lr_schedule``, ``warmup_steps``, ...)."""
    hp = _hp({"n_epochs": n_epochs, "batch_size": batch_size,
              "learning_rate_multiplier": learning_rate_multiplier}, hyperparameters)
    return {"type": "supervised", "supervised": {"hyperparameters": hp}}


def dpo(*, beta: Optional[AutoOr] = None, loss_type: Optional[str] = None, n_epochs: Optional[AutoOr] = None,
        batch_size: Optional[AutoOr] = None, learning_rate_multiplier: Optional[AutoOr] = None,
        **hyperparameters: Any) -> DpoMethod:
    """A DPO method block; ``loss_type`` is sigmoid, ipo, hinge, robust, apo_zero, simpo or
    orpo; ``hyperparameters`` add ``label_smoothing``, ``rpo_alpha``, ``simpo_gamma``, ..."""
    hp = _hp({"beta": beta, "loss_type": loss_type, "n_epochs": n_epochs, "batch_size": batch_size,
              "learning_rate_multiplier": learning_rate_multiplier}, hyperparameters)
    return {"type": "dpo", "dpo": {"hyperparameters": hp}}


def reward_model(*, n_epochs: Optional[AutoOr] = None, batch_size: Optional[AutoOr] = None,
                 learning_rate_multiplier: Optional[AutoOr] = None, **hyperparameters: Any) -> RewardModelMethod:
    """A reward-model method block (smelt; Bradley-Terry on preference rows);
    ``hyperparameters`` add ``center_rewards_coefficient``, ``max_steps``, ..."""
    hp = _hp({"n_epochs": n_epochs, "batch_size": batch_size,
              "learning_rate_multiplier": learning_rate_multiplier}, hyperparameters)
    return {"type": "reward_model", "reward_model": {"hyperparameters": hp}}


def grpo(reward: RewardSpec, *, n_epochs: Optional[AutoOr] = None, batch_size: Optional[AutoOr] = None,
         learning_rate_multiplier: Optional[AutoOr] = None, **hyperparameters: Any) -> GrpoMethod:
    """A GRPO method block (smelt): the reward spec and hyperparameters, which add the spec's
    ``rl`` fields by name (``num_generations``, ``max_new_tokens``, ``max_iterations``,
    ``loss_type``, ``beta``, ``placement``, ``rollout_workers``, ...)."""
    hp = _hp({"n_epochs": n_epochs, "batch_size": batch_size,
              "learning_rate_multiplier": learning_rate_multiplier}, hyperparameters)
    return {"type": "grpo", "grpo": {"hyperparameters": hp, "reward": dict(reward)}}


def ppo(reward: RewardSpec, *, critic_model: Optional[str] = None, n_epochs: Optional[AutoOr] = None,
        batch_size: Optional[AutoOr] = None, learning_rate_multiplier: Optional[AutoOr] = None,
        **hyperparameters: Any) -> PpoMethod:
    """A PPO method block (smelt): as grpo, plus the critic's settings (``critic_model``
    names a model as a job's ``model`` does; ``critic_learning_rate``, ``gamma``, ``lambda``, ...)."""
    hp = _hp({"critic_model": critic_model, "n_epochs": n_epochs, "batch_size": batch_size,
              "learning_rate_multiplier": learning_rate_multiplier}, hyperparameters)
    return {"type": "ppo", "ppo": {"hyperparameters": hp, "reward": dict(reward)}}


def reinforcement(grader: Grader, *, n_epochs: Optional[AutoOr] = None, batch_size: Optional[AutoOr] = None,
                  learning_rate_multiplier: Optional[AutoOr] = None, compute_multiplier: Optional[AutoOr] = None,
                  eval_interval: Optional[AutoOr] = None, eval_samples: Optional[AutoOr] = None,
                  reasoning_effort: Optional[str] = None, **hyperparameters: Any) -> ReinforcementMethod:
    """OpenAI's reinforcement method block: a grader (required) and OpenAI's seven
    hyperparameters, plus smelt's GRPO ones by name (``max_new_tokens``, ``max_iterations``, ...)."""
    hp = _hp({"n_epochs": n_epochs, "batch_size": batch_size, "learning_rate_multiplier": learning_rate_multiplier,
              "compute_multiplier": compute_multiplier, "eval_interval": eval_interval,
              "eval_samples": eval_samples, "reasoning_effort": reasoning_effort}, hyperparameters)
    block: ReinforcementBlock = {"grader": dict(grader)}
    if hp:
        block["hyperparameters"] = hp
    return {"type": "reinforcement", "reinforcement": block}
