"""Which policy ``horizon serve`` and ``horizon score`` apply, and where each setting came from.

A model is exported with the policy the user's ``[export]`` section names (its card records
it), and CPE estimated that policy: serving it by default keeps the logged propensities those
of the policy that was evaluated. ``--policy``, ``--epsilon`` and ``--temperature`` override
it, each flag given on the command line winning on its own; a setting not given comes from the
card when the card's policy uses it (epsilon for epsilon_greedy, temperature for softmax), else
from the flag's default. A model whose card records no policy, and a continuous actor (whose
action is its own), get the flags and their defaults, as before cards recorded one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from horizon_engine import Exploration, ModelCard

DEFAULTS: dict[str, Any] = {"policy": "greedy", "epsilon": 0.1, "temperature": 1.0}
"""The flags' defaults: what a model whose card records no policy is served with."""
USES: dict[str, tuple[str, ...]] = {
    "greedy": (),
    "epsilon_greedy": ("epsilon",),
    "softmax": ("temperature",),
}
"""The setting each policy uses besides its name (the others do not change its draws)."""
CARD = "model card"
DEFAULT = "default"


@dataclass(frozen=True)
class PolicyFlags:
    """``--policy``, ``--epsilon`` and ``--temperature`` as given: None where not given."""

    policy: str | None = None
    epsilon: float | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class ServedPolicy:
    """The ``Exploration`` applied and, for each setting that counts for it, where it came
    from: ``model card``, the flag (``--epsilon``), ``default`` or ``the caller`` (a
    ``Predictor`` given one); for a continuous ``actor``, none (its action is its own)."""

    exploration: Exploration
    sources: dict[str, str] = field(default_factory=dict)
    actor: bool = False

    @property
    def label(self) -> str:
        """What the decision log records: ``Exploration.label``, or ``actor``."""
        return "actor" if self.actor else self.exploration.label

    def describe(self) -> str:
        """One line for the command's output: ``epsilon_greedy(epsilon=0.2) (policy from the
        model card, epsilon from --epsilon)``."""
        if self.actor:
            return "actor (a continuous actor's own action; --policy does not apply)"
        origins = ", ".join(f"{name} from {source}" for name, source in self.sources.items())
        return f"{self.label} ({origins})"

    def as_dict(self) -> dict[str, Any]:
        """What ``GET /health`` says of it."""
        return {"label": self.label, "from": dict(self.sources)}


def served_policy(card: ModelCard, flags: PolicyFlags) -> ServedPolicy:
    """The policy to serve ``card``'s model with under ``flags`` (see the module)."""
    if card.continuous:
        return ServedPolicy(Exploration(), actor=True)
    recorded = card.exploration
    from_card: dict[str, Any] = {}
    if recorded is not None:
        from_card = {name: getattr(recorded, name) for name in ("policy", *USES[recorded.policy])}
    chosen: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in ("policy", "epsilon", "temperature"):
        given = getattr(flags, name)
        if given is not None:
            chosen[name], sources[name] = given, f"--{name}"
        elif name in from_card:
            chosen[name], sources[name] = from_card[name], CARD
        else:
            chosen[name], sources[name] = DEFAULTS[name], DEFAULT
    policy = chosen["policy"]
    exploration = Exploration(
        policy, chosen["epsilon"] if policy == "epsilon_greedy" else 0.0, chosen["temperature"]
    )
    return ServedPolicy(exploration, {name: sources[name] for name in ("policy", *USES[policy])})
