"""A round of a product's traffic: its users ask a decision service for actions and report
rewards late.

The decision service is ``horizon serve``'s ``POST /decisions`` (``DecisionClient``, plain
HTTP) or, in round 0, ``random_service``, the uniformly random logging policy writing the same
decision rows. Either takes a list of request rows (``state_features``, ``mdp_id``,
``sequence_number``) and returns the decisions, each with its ``decision_id``, ``action`` and
``timestamp``. The product's feedback on each decision becomes reward rows stamped at the
decision's timestamp plus the report's delay.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from products import EngagementMdp, Feedback, NotificationBandit

from horizon_plugins_serving.decision_log import DecisionLog, decision_rows

Decide = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
"""A decision service: ``horizon serve``'s request rows in, its answers' decisions out."""


class DecisionClient:
    """``horizon serve``'s ``POST /decisions`` over one keep-alive connection: plain HTTP, as
    any product's client would call it."""

    MAX_ROWS = 1000
    """Rows per request, under the server's default ``--max-batch`` of 1,024."""

    def __init__(self, url: str) -> None:
        address = urllib.parse.urlsplit(url)
        self.connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)

    def decide(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        decisions = []
        for start in range(0, len(rows), self.MAX_ROWS):
            body = json.dumps({"rows": rows[start : start + self.MAX_ROWS]})
            self.connection.request(
                "POST", "/decisions", body, {"Content-Type": "application/json"}
            )
            response = self.connection.getresponse()
            answer = response.read().decode("utf-8")
            if response.status != 200:
                raise RuntimeError(f"POST /decisions answered {response.status}: {answer}")
            decisions += json.loads(answer)["decisions"]
        return decisions

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> DecisionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def random_service(actions: Sequence[str], seed: int, log: DecisionLog) -> Decide:
    """Round 0's logging policy: uniformly random, each decision logged with 1/n."""
    rng = np.random.default_rng(seed)

    def decide(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        chosen = [actions[i] for i in rng.integers(0, len(actions), len(rows))]
        logged = decision_rows(
            [row["state_features"] for row in rows],
            chosen,
            [1.0 / len(actions)] * len(rows),
            "uniform-random",
            all_actions=list(actions),
            mdp_ids=[row["mdp_id"] for row in rows],
            sequence_numbers=[row.get("sequence_number", 0) for row in rows],
        )
        log.append(logged)
        return logged

    return decide


def reward_rows(decision: dict[str, Any], feedback: Feedback) -> list[dict[str, Any]]:
    """The product's late metric rows about one decision, stamped at its time plus delay."""
    decided = datetime.fromisoformat(decision["timestamp"])
    return [
        {
            "decision_id": decision["decision_id"],
            "timestamp": (decided + timedelta(hours=delay)).isoformat(),
            "metrics": metrics,
        }
        for delay, metrics in feedback.reports
    ]


def play_bandit(
    bandit: NotificationBandit, decide: Decide, users: int, batch_size: int, round_number: int
) -> list[dict[str, Any]]:
    """``users`` users in requests of ``batch_size``; their reward rows.

    Each decision is its own episode, named by the round and the user's place in it, so that
    the pipeline's eval split (a hash of mdp_id) is the same on every run of the loop."""
    rewards = []
    for first in range(0, users, batch_size):
        observations = bandit.reset(min(batch_size, users - first))
        decisions = decide(
            [
                {"state_features": state, "mdp_id": f"round-{round_number}-user-{user}"}
                for user, state in enumerate(observations, start=first)
            ]
        )
        feedback = bandit.step([decision["action"] for decision in decisions])
        for decision, reported in zip(decisions, feedback, strict=True):
            rewards += reward_rows(decision, reported)
    return rewards


def play_mdp(
    mdp: EngagementMdp, decide: Decide, users: int, round_number: int
) -> list[dict[str, Any]]:
    """``users`` users' episodes side by side: one request a day holds the day of every
    running episode (the next state depends on the action, so no day can be asked early)."""
    observations = mdp.reset(users)
    running = [f"round-{round_number}-user-{user}" for user in range(users)]
    rewards = []
    day = 0
    while running:
        rows = [
            {"state_features": state, "mdp_id": user, "sequence_number": day}
            for state, user in zip(observations, running, strict=True)
        ]
        decisions = decide(rows)
        observations, ended, feedback = mdp.step([decision["action"] for decision in decisions])
        for decision, reported in zip(decisions, feedback, strict=True):
            rewards += reward_rows(decision, reported)
        running = [user for user, done in zip(running, ended, strict=True) if not done]
        day += 1
    return rewards
