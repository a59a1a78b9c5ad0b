"""Adam and SGD as ``torch.optim``'s foreach implementations compute them, without
``torch.optim``.

The first call into ``torch.optim`` (constructing any optimizer, even with ``foreach`` or
``fused`` given) imports ``torch._dynamo`` to mark its methods as not to be compiled: 1-2 s of
every train stage, before the first update, for a compiler no trainer here uses. These two
classes make the same tensor operations in the same order as ``torch.optim.Adam`` and
``torch.optim.SGD`` with ``foreach=True`` (L2 ``weight_decay`` added to the gradient, no
momentum, amsgrad or maximize), so an update's numbers are identical, bit for bit
(tests/test_dqn.py and tests/test_ac_trainers.py hold them to it). Their ``state_dict`` has
``torch.optim``'s layout, so a checkpoint written with ``torch.optim.Adam`` warm-starts them
and the other way round. They are public (``horizon_engine.ForeachAdam``, ...) so that every
trainer plugin can use them: the dqn and ac plugins do.

torch is imported where it is used.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


TORCH_ADAM_FLAGS = {
    "amsgrad": False,
    "maximize": False,
    "foreach": True,
    "capturable": False,
    "differentiable": False,
    "fused": None,
    "decoupled_weight_decay": False,
}
"""The options of ``torch.optim.Adam`` that ``ForeachAdam`` computes as: kept in its
``param_groups`` (and so in a checkpoint), which ``torch.optim.Adam.load_state_dict`` reads."""

TORCH_SGD_FLAGS = {
    "momentum": 0.0,
    "dampening": 0.0,
    "nesterov": False,
    "maximize": False,
    "foreach": True,
    "differentiable": False,
    "fused": None,
}
"""The same for ``torch.optim.SGD`` and ``ForeachSgd``."""


class ForeachOptimizer:
    """One group of parameters, its hyperparameters in ``param_groups[0]`` (``lr`` may be
    changed between steps, as a learning-rate decay does), and per-parameter state."""

    def __init__(self, parameters: Iterable[torch.nn.Parameter], **hyperparameters: Any) -> None:
        self.parameters = list(parameters)
        self.param_groups: list[dict[str, Any]] = [dict(hyperparameters)]
        self.state: list[dict[str, Any]] = [{} for _ in self.parameters]

    def zero_grad(self) -> None:
        """Forget the gradients (set them to None, as ``zero_grad(set_to_none=True)`` does):
        the next backward pass writes fresh ones."""
        for parameter in self.parameters:
            parameter.grad = None

    def _with_gradients(self) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor]]:
        """The positions, parameters and gradients of the parameters that have a gradient (a
        parameter the loss did not reach keeps its value and state, as in torch.optim)."""
        found = [(i, p, p.grad) for i, p in enumerate(self.parameters) if p.grad is not None]
        if not found:
            return [], [], []
        indices, parameters, gradients = map(list, zip(*found, strict=True))
        return indices, parameters, gradients

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim``'s layout: ``state`` by parameter position (a ``step`` as a float32
        scalar tensor), and ``param_groups`` holding the hyperparameters and the positions."""
        import torch

        state = {}
        for index, entry in enumerate(self.state):
            if entry:
                state[index] = {
                    name: torch.tensor(value) if name == "step" else value
                    for name, value in entry.items()
                }
        group = {**self.param_groups[0], "params": list(range(len(self.parameters)))}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output, or a ``torch.optim`` optimizer's of the same kind
        over the same parameters (its tensors copied: ``state`` may be another optimizer's
        live state)."""
        (group,) = state["param_groups"]
        if len(group["params"]) != len(self.parameters):
            raise ValueError(
                f"the optimizer state holds {len(group['params'])} parameters, this optimizer "
                f"{len(self.parameters)}"
            )
        position = {saved: index for index, saved in enumerate(group["params"])}
        self.param_groups[0].update(
            {name: group[name] for name in self.param_groups[0] if name in group}
        )
        self.state = [{} for _ in self.parameters]
        for saved, entry in state["state"].items():
            parameter = self.parameters[position[int(saved)]]
            self.state[position[int(saved)]] = {
                name: float(value)
                if name == "step"
                else value.to(device=parameter.device, dtype=parameter.dtype, copy=True)
                for name, value in entry.items()
            }


class ForeachAdam(ForeachOptimizer):
    """``torch.optim.Adam(parameters, lr, weight_decay=..., foreach=True)``."""

    def __init__(
        self,
        parameters: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(
            parameters,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            **TORCH_ADAM_FLAGS,
        )

    def step(self) -> None:
        """One Adam step of every parameter with a gradient, as ``torch.optim.Adam``'s
        ``_multi_tensor_adam`` makes it on steps held on the CPU."""
        import torch

        indices, parameters, gradients = self._with_gradients()
        if not parameters:
            return
        group = self.param_groups[0]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
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
            if weight_decay != 0:
                gradients = torch._foreach_add(gradients, parameters, alpha=weight_decay)
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


class ForeachSgd(ForeachOptimizer):
    """``torch.optim.SGD(parameters, lr, weight_decay=..., foreach=True)``: plain gradient
    descent, no momentum."""

    def __init__(
        self, parameters: Iterable[torch.nn.Parameter], lr: float = 1e-3, weight_decay: float = 0.0
    ) -> None:
        super().__init__(parameters, lr=lr, weight_decay=weight_decay, **TORCH_SGD_FLAGS)

    def step(self) -> None:
        """``parameter -= lr * (gradient + weight_decay * parameter)``, for all at once."""
        import torch

        _, parameters, gradients = self._with_gradients()
        if not parameters:
            return
        group = self.param_groups[0]
        with torch.no_grad():
            if group["weight_decay"] != 0:
                gradients = torch._foreach_add(gradients, parameters, alpha=group["weight_decay"])
            torch._foreach_add_(parameters, gradients, alpha=-group["lr"])
