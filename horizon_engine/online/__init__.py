"""``horizon gym train``: online reinforcement learning in a Gymnasium environment.

The successor of Horizon's ``run_gym.py``. The agent plays epsilon-greedy, keeps
every transition in a replay buffer, trains every ``train_every_ts`` steps once
``train_after_ts`` warm-up steps of uniform random play are collected, evaluates its greedy
policy every ``test_every_ts`` steps over ``avg_over_num_episodes`` episodes, and stops early
once their mean return reaches the score bar. The trainers, their ``[trainer]`` options and the
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
- Every collected transition can be written as pre-timeline rows in the gym source's format,
  so the batch pipeline (``[source] kind = "jsonl"``) can train on them offline.

torch and gymnasium are imported where they are used, as everywhere in the core.

Modules: ``config`` (gym.toml), ``replay_buffer``, ``runner`` (playing, training, evaluating),
``results`` (evaluations and the reward history) and ``export`` (a gym run's model).
"""
