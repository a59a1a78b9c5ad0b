"""Discrete DQN (double Q, dueling, n-step, CQL, BCQ) and parametric DQN trainers.

Registered through the ``horizon`` entry point like any third-party plugin; the trainers
arrive with the DQN work and it registers nothing yet.
"""
