"""Counterfactual policy evaluation: DM, IPS, DR, sequential DR, weighted DR and MAGIC.

Registered through the ``horizon`` entry point like any third-party plugin; the estimators
arrive with the evaluation work and it registers nothing yet.
"""
