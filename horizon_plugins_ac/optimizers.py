"""Adam as ``torch.optim.Adam(..., foreach=True)`` computes it, without ``torch.optim``.

Constructing any ``torch.optim`` optimizer imports ``torch._dynamo`` (1-2 s before the first
update, for a compiler nothing here uses). ``ForeachAdam`` makes the same tensor operations in
the same order (no weight decay, amsgrad or maximize), one call per step for every parameter,
and its ``state_dict`` has ``torch.optim``'s layout (tests/test_ac_trainers.py compares the two).
torch is imported where it is used.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class ForeachAdam:
    """``torch.optim.Adam(parameters, lr, foreach=True)``: one group, per-parameter state."""

    def __init__(
        self,
        parameters: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.parameters = list(parameters)
        self.param_groups: list[dict[str, Any]] = [
            {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0}
        ]
        self.state: list[dict[str, Any]] = [{} for _ in self.parameters]

    def zero_grad(self) -> None:
        """Forget the gradients (``zero_grad(set_to_none=True)``)."""
        for parameter in self.parameters:
            parameter.grad = None

    def step(self) -> None:
        """One Adam step of every parameter that has a gradient."""
        import torch

        found = [(i, p, p.grad) for i, p in enumerate(self.parameters) if p.grad is not None]
        if not found:
            return
        indices, parameters, gradients = (list(part) for part in zip(*found, strict=True))
        group = self.param_groups[0]
        lr, eps = group["lr"], group["eps"]
        beta1, beta2 = group["betas"]
        states = [self.state[index] for index in indices]
        for state, parameter in zip(states, parameters, strict=True):
            if not state:
                state["step"] = 0.0
                state["exp_avg"] = torch.zeros_like(parameter)
                state["exp_avg_sq"] = torch.zeros_like(parameter)
            state["step"] += 1.0
        exp_avgs = [state["exp_avg"] for state in states]
        exp_avg_sqs = [state["exp_avg_sq"] for state in states]
        with torch.no_grad():
            torch._foreach_lerp_(exp_avgs, gradients, 1 - beta1)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, gradients, gradients, 1 - beta2)
            steps = [state["step"] for state in states]
            step_size = [(lr / (1 - beta1**step)) * -1 for step in steps]
            correction2_sqrt = [(1 - beta2**step) ** 0.5 for step in steps]
            denominators = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_div_(denominators, correction2_sqrt)
            torch._foreach_add_(denominators, eps)
            torch._foreach_addcdiv_(parameters, exp_avgs, denominators, step_size)

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim``'s layout: ``state`` by parameter position (``step`` a tensor) and
        ``param_groups`` holding the hyperparameters and the positions."""
        import torch

        state = {
            index: {
                name: torch.tensor(value) if name == "step" else value
                for name, value in entry.items()
            }
            for index, entry in enumerate(self.state)
            if entry
        }
        group = {**self.param_groups[0], "params": list(range(len(self.parameters)))}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output (or ``torch.optim.Adam``'s over the same
        parameters); tensors are copied."""
        (group,) = state["param_groups"]
        if len(group["params"]) != len(self.parameters):
            raise ValueError(
                f"the optimizer state holds {len(group['params'])} parameters, this optimizer "
                f"{len(self.parameters)}"
            )
        position = {saved: index for index, saved in enumerate(group["params"])}
        for name in ("lr", "betas", "eps"):
            if name in group:
                self.param_groups[0][name] = group[name]
        self.state = [{} for _ in self.parameters]
        for saved, entry in state["state"].items():
            index = position[int(saved)]
            parameter = self.parameters[index]
            self.state[index] = {
                name: float(value)
                if name == "step"
                else value.to(device=parameter.device, dtype=parameter.dtype, copy=True)
                for name, value in entry.items()
            }
