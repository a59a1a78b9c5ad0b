"""Actor-critic trainers for continuous actions: DDPG, SAC and TD3.

Registered through the ``horizon`` entry point like any third-party plugin; the trainers
arrive with the actor-critic work and it registers nothing yet.
"""
