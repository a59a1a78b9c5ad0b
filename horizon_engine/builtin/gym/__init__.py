"""The gym plugin: ``horizon gym collect`` and ``horizon gym train`` (online reinforcement
learning in a Gymnasium environment), a built-in plugin like any other: it adds the ``gym``
command group through ``horizon_register_commands``, and the core imports none of it.

``horizon gym train`` is the successor of Horizon's ``run_gym.py``. The agent plays
epsilon-greedy (with its trainer's own noise on a Box action space), keeps every transition
in a replay buffer, trains every ``train_every_ts`` steps once ``train_after_ts`` warm-up steps
of uniform random play are collected, evaluates its greedy policy every ``test_every_ts``
steps over ``avg_over_num_episodes`` episodes, and stops early once their mean return reaches
the score bar. The trainers, their ``[trainer]`` options and the
``[normalization]`` options are those of pipeline.toml, validated by the same code
(``ConfigBuilder``), so any registered discrete-action trainer plays online unchanged, and a
parametric one (``parametric_dqn``) with ``[gym] parametric_actions``, which offers each action
as one-hot action features.

Decisions:

- Normalization is identified once, from the warm-up's observations (random play), and written
  to ``normalization.json``; the network applies it in its forward pass, so it must not move
  under a network being trained. A warm start reuses the earlier run's file instead, since its
  weights were trained on that normalization.
- Epsilon is 1 during the warm-up (there is no model yet), then falls linearly from
  ``epsilon_start`` to ``epsilon_end`` over ``epsilon_decay_steps`` steps.
- A time-limit truncation (the environment's own, or ``max_steps``) is not terminal: the
  transition bootstraps from its last observation. Only termination zeroes the future.
- ``next_action`` is the action the behaviour policy chose in the next state; after a
  truncation that action is drawn (for SARSA) but never played; after termination it is -1.
- The acting policy is a copy of ``trainer.policy()`` refreshed every ``policy_refresh_ts``
  steps: the copy costs about as much as an update of a small network. Propensities are exact
  for the copy that acted.
- A Box action space (bounded: an unbounded one is refused) is played by a continuous-action
  trainer (``sac``, ``td3``, ``ddpg``): the warm-up draws uniformly inside the bounds, then the
  runner acts with the trainer's ``exploration_policy()`` (its own noise; ``reset()`` at each
  episode start; refreshed like the discrete acting copy) and evaluates its deterministic
  ``policy()`` (a stochastic one's action). Actions are stored raw, in the user's units, as
  the batch schema's continuous ``action`` ``[B, G]``, with action feature ids following the
  state's, as the gym source logs Box actions; propensities are 1.0, as there. Their
  ``continuous_action`` normalization maps the Box's own [low, high], not the warm-up's
  observed range, which uniform play never quite reaches: the actor's (-1, 1) then spans
  exactly what the environment accepts, and the exported model's actions stay inside it.
- Every collected transition can be written as pre-timeline rows in the gym source's format,
  so the batch pipeline (``[source] kind = "jsonl"``) can train on them offline.
- Training is the core's training driver (``horizon_engine.driver``), as in ``horizon run``:
  the runner calls its per-batch step from the environment loop (batches sampled from the
  replay buffer, whose n-step window is ``[gym] n_step``) and ends an "epoch" at each
  evaluation. The run folder then describes itself (``problem.json``, and ``check_rows.pt``:
  greedy-play states), so ``horizon export`` re-exports a gym run as it does any trained run.
- ``--resume`` continues a killed or interrupted run from its last evaluation to the result of
  the uninterrupted run, to the bit on a CPU: the runner's state is saved beside each
  evaluation's checkpoint, and the training environment, which Gymnasium cannot save, is
  brought back by replaying its episode (``runner.OnlineRun`` says how).

torch and gymnasium are imported where they are used, as everywhere in the core: loading this
plugin (``horizon --help``, ``horizon plugins``) imports neither.

Modules: ``commands`` (the ``gym`` group), ``config`` (gym.toml), ``replay_buffer``,
``runner`` (playing, training, evaluating), ``resume`` (what ``--resume`` reads and checks) and
``results`` (evaluations and the reward history).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from horizon_engine import hookimpl

if TYPE_CHECKING:
    import click


@hookimpl
def horizon_register_commands(cli: click.Group) -> None:
    """Add ``horizon gym`` (``collect`` and ``train``)."""
    from horizon_engine.builtin.gym.commands import gym

    cli.add_command(gym)
