"""Fixtures shared by the test suite.

``plugin_site`` installs plugins the way pip does, without pip or a network: a package folder
plus a ``<name>-<version>.dist-info`` folder (METADATA and entry_points.txt) in a fresh folder
put on ``sys.path``. ``importlib.metadata`` then finds their entry points exactly as it finds an
installed distribution's, so Horizon Engine discovers them through its ``horizon`` group.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sys
import textwrap
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest


class PluginSite:
    """A site-packages folder on ``sys.path`` that tests install plugin distributions into."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def install(
        self,
        distribution: str,
        version: str,
        entry_points: Mapping[str, str],
        modules: Mapping[str, str] | None = None,
    ) -> None:
        """Install ``modules`` (file name -> source text) and a dist-info declaring the entry
        points (plugin name -> ``module`` or ``module:attribute``) in the ``horizon`` group."""
        for filename, source in (modules or {}).items():
            target = self.path / filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(textwrap.dedent(source), encoding="utf-8")
        folder = re.sub(r"[-_.]+", "_", distribution).lower()
        dist_info = self.path / f"{folder}-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n", encoding="utf-8"
        )
        lines = [f"{name} = {value}" for name, value in entry_points.items()]
        (dist_info / "entry_points.txt").write_text(
            "[horizon]\n" + "\n".join(lines) + "\n", encoding="utf-8"
        )
        importlib.invalidate_caches()

    def install_project(self, project: Path) -> None:
        """Install a plugin project from its pyproject.toml: its packages and entry points."""
        metadata = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
        for package in metadata["tool"]["setuptools"]["packages"]:
            shutil.copytree(project / package, self.path / package)
        meta = metadata["project"]
        self.install(meta["name"], meta["version"], meta["entry-points"]["horizon"])


@pytest.fixture
def plugin_site(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PluginSite]:
    """An empty site folder on ``sys.path``; what is imported from it is forgotten afterwards.

    Forgetting the modules matters: a later test installing a plugin of the same name must
    import its own copy, not find this test's module (and its state) in ``sys.modules``.
    """
    site = PluginSite(tmp_path_factory.mktemp("site"))
    monkeypatch.syspath_prepend(str(site.path))
    yield site
    for name, module in list(sys.modules.items()):
        if site.path in Path(getattr(module, "__file__", None) or "/").parents:
            del sys.modules[name]
    importlib.invalidate_caches()


# --- Spark --------------------------------------------------------------------------------------

TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Java options for the suite's short-lived Spark JVMs: the quick compiler only and one
garbage-collection thread. Each JVM lives seconds on a few thousand rows, where the optimizing
compiler's and the parallel collector's threads cost more CPU than they save. Measured as the
machine's busy CPU: the tests marked ``spark`` (``-n 2``) took 607 CPU-seconds and 311 s
without them, 367 and 201 s with them; test_timeline_spark.py alone 89 and 62 CPU-seconds in
the same wall time. Every JVM a test starts inherits them: spark-submit's and PySpark's driver
(``SPARK_SUBMIT_OPTS``), the standalone master and workers (``SPARK_DAEMON_JAVA_OPTS``); the
cluster test gives them to its executors. What a user's JVM runs with is left as it is."""


def pytest_configure(config: pytest.Config) -> None:
    for name in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
        os.environ.setdefault(name, TEST_JVM_OPTIONS)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local SparkSession for every Spark test: a session takes seconds to start.

    Started by the Spark plugin's own ``spark_session``; a pipeline run inside a test then finds
    it active and uses it rather than starting another. Two cores, few shuffle partitions (the
    test data is tiny), no UI, and a warehouse folder that is not the working directory.
    """
    from horizon_plugins_spark import SparkOptions, spark_session

    options = SparkOptions(
        master="local[2]",
        app_name="horizon-engine-tests",
        conf={
            "spark.sql.shuffle.partitions": 4,
            "spark.default.parallelism": 2,
            "spark.ui.enabled": False,
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("spark-warehouse")),
        },
    )
    session = spark_session(options)
    yield session
    session.stop()


# --- A tiny trainer, to drive the core's training loop and export without a real algorithm ---

MEAN_REWARD_PLUGIN = '''
import torch

from horizon_engine import hookimpl
from horizon_engine.training import TrainerBase, TrainerConfig

EPOCHS = []


class MeanRewardConfig(TrainerConfig):
    learning_rate: float = 0.05
    """Step size of the one weight."""


class Scores(torch.nn.Module):
    """The weight plus the normalized features' sum, with a sign per action."""

    def __init__(self, weight, preprocessor, actions):
        super().__init__()
        self.weight, self.preprocessor = weight, preprocessor
        self.register_buffer("signs", torch.tensor([(-1.0) ** a for a in range(actions)]))

    def forward(self, values, presence):
        features = self.preprocessor(values, presence).sum(dim=1, keepdim=True)
        return self.weight + features * self.signs


class MeanReward(TrainerBase):
    """Learns one number, the mean reward, by SGD: enough to drive the loop."""

    name = "mean_reward"
    Config = MeanRewardConfig

    def setup(self, problem):
        self.problem = problem
        self.weight = torch.zeros(1, requires_grad=True, device=problem.device)
        self.optimizer = torch.optim.SGD([self.weight], lr=self.config.learning_rate)
        self.steps = 0

    def train_step(self, batch):
        loss = ((batch["reward"] - self.weight) ** 2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return {"loss": float(loss.detach())}

    def evaluate(self, data):
        return {"mc_loss": float(((data.reward - self.weight.detach()) ** 2).mean())}

    def state_dict(self):
        return {"weight": self.weight.detach().clone(), "steps": self.steps,
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state):
        with torch.no_grad():
            self.weight.copy_(state["weight"])
        self.steps = state["steps"]
        self.optimizer.load_state_dict(state["optimizer"])

    def policy(self):
        weight = self.weight.detach().clone()
        return Scores(weight, self.problem.state_preprocessor, len(self.problem.actions))


@hookimpl
def horizon_register_trainers(register):
    register(MeanReward)


@hookimpl
def horizon_on_epoch_end(epoch, metrics):
    EPOCHS.append((epoch, dict(metrics)))
'''


@pytest.fixture
def trainer_host(plugin_site: PluginSite) -> Any:
    """A plugin host with the ``mean_reward`` trainer installed as a third-party plugin."""
    from horizon_engine.plugins import PluginHost

    module = "horizon_plugin_mean_reward"
    plugin_site.install(
        "horizon-plugin-mean-reward",
        "1.0",
        {"mean_reward": module},
        {f"{module}.py": MEAN_REWARD_PLUGIN},
    )
    return PluginHost(env={"HORIZON_LOAD_PLUGINS": "mean_reward"})


# --- Hypothesis: a small profile for every `make test`, a long one behind HYPOTHESIS_PROFILE ---


def _register_hypothesis_profiles() -> None:
    """``ci`` (the default) keeps `make test` short; ``long`` is the bar the property tests are
    held to before a release: ``HYPOTHESIS_PROFILE=long pytest -m fuzz`` (10,000 examples per
    test). Neither keeps a deadline: a slow example on a loaded machine is not a failure, and
    the example database is off so that a run never depends on an earlier one's files."""
    import os

    from hypothesis import HealthCheck, settings

    common = {
        "deadline": None,
        "database": None,
        "derandomize": True,
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    }
    settings.register_profile("ci", max_examples=150, **common)
    settings.register_profile("long", max_examples=10_000, **common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


_register_hypothesis_profiles()
