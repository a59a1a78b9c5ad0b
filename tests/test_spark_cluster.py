"""The Spark timeline on a real cluster: a standalone master and two workers, over spark-submit.

``local[N]`` runs the driver and the executors in one JVM, so it cannot show what a cluster
changes: the executors are other processes, started by the workers, that read the run's rows
and write its files themselves. The master and workers are the ones pyspark ships
(``spark-class``), bound to 127.0.0.1 alone, web UIs included, and stopped with their
executors whatever the test's outcome. The job is the documented command (``spark-submit
--master spark://...`` of ``horizon_plugins_spark.submit``) on the parity test's rows, and its
timeline must equal the local engine's, value for value. A run folder the executors cannot see
(the workers are kept from it by a mount namespace, as a machine without the shared mount is)
must stop the run with one line that says so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest
from test_timeline_parity import (
    assert_same_timeline,
    build,
    generated_rows,
    parity_config,
    read_timeline,
)

from tests.conftest import TEST_JVM_OPTIONS
from tests.reliability.conftest import toml_text

pytestmark = [pytest.mark.spark, pytest.mark.slow]

WORKERS = 2
ROWS = 10_000
"""The parity test's rows, a tenth as many: every filter still drops rows, and the local
engine's side and the files to compare shrink; the cluster's side is the JVMs' and the jobs'
start-up, whatever the rows."""
STARTUP_SECONDS = 90
"""How long the master and workers may take to start and register: JVMs on a busy machine."""
SUBMIT_SECONDS = 240


@dataclass(frozen=True)
class Cluster:
    """A running standalone cluster: where to submit, and what its workers wrote."""

    master_url: str
    work_dirs: list[Path]
    environment: dict[str, str]
    unshared: Path | None
    """A folder the workers and their executors see empty, as a cluster's machines see a
    folder of the driver's that is not on a shared mount (None: this machine cannot hide one)."""


def free_port() -> int:
    """A port on the loopback that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def alive_workers(web_ui_port: int) -> int:
    """How many workers the master's JSON view says are ALIVE (0 while it is not up yet).

    Not up yet includes a master whose UI has started before it became the leader: it was
    seen answering ``/json/`` with its HTML page then, the workers registering meanwhile."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{web_ui_port}/json/", timeout=2) as reply:
            state = json.load(reply)
    except (OSError, ValueError):
        return 0
    return sum(worker.get("state") == "ALIVE" for worker in state.get("workers", []))


def stop(process: subprocess.Popen[bytes]) -> None:
    """End a daemon and everything it started (a worker's executors): its process group."""
    for sent in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sent)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def daemon(main_class: str, *args: str | int | Path) -> list[str]:
    """The command that starts Spark's standalone ``deploy.<main_class>`` on 127.0.0.1."""
    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    name = f"org.apache.spark.deploy.{main_class}"
    return [str(spark_class), name, "--host", "127.0.0.1", *(str(arg) for arg in args)]


def worker(master_url: str, work_dir: Path) -> list[str]:
    """A one-core worker of ``master_url`` that starts its executors in ``work_dir``."""
    return daemon(
        "worker.Worker",
        master_url,
        *("--port", free_port(), "--webui-port", free_port()),
        *("--cores", 1, "--memory", "1g", "--work-dir", work_dir),
    )


def hiding(folder: Path) -> list[str]:
    """A command prefix that runs its command with an empty ``folder`` of its own, a tmpfs in a
    mount namespace of its own, or nothing where Linux does not let this user make one."""
    prefix = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c"]
    prefix += ['mount -t tmpfs tmpfs "$0" && exec "$@"', str(folder)]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return prefix if probe.returncode == 0 else []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master and ``WORKERS`` one-core workers on 127.0.0.1, for the module's tests."""
    folder = tmp_path_factory.mktemp("spark-cluster")
    spark_home = Path(pyspark.__file__).parent
    (folder / "conf").mkdir()
    # The executors' JVMs run with the suite's other test JVMs' options.
    (folder / "conf" / "spark-defaults.conf").write_text(
        f"spark.executor.extraJavaOptions {TEST_JVM_OPTIONS}\n"
    )
    environment = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        # No spark-defaults.conf or spark-env.sh of the machine's: the test's settings alone.
        "SPARK_CONF_DIR": str(folder / "conf"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
        "PYSPARK_PYTHON": sys.executable,
    }
    port, web_ui_port = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    work_dirs = [folder / f"worker{index}" for index in range(WORKERS)]
    unshared = folder / "unshared"
    unshared.mkdir()
    hidden = hiding(unshared)
    commands = [
        daemon("master.Master", "--port", port, "--webui-port", web_ui_port),
        *([*hidden, *worker(master_url, work_dir)] for work_dir in work_dirs),
    ]
    processes: list[subprocess.Popen[bytes]] = []
    logs = [folder / f"daemon{index}.log" for index in range(len(commands))]
    try:
        for command, log in zip(commands, logs, strict=True):
            with log.open("wb") as output:
                processes.append(
                    subprocess.Popen(
                        command,
                        env=environment,
                        stdout=output,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + STARTUP_SECONDS
        while alive_workers(web_ui_port) < WORKERS:
            ended = [process.args for process in processes if process.poll() is not None]
            if ended or time.monotonic() > deadline:
                tails = "\n".join(log.read_text(errors="replace")[-2000:] for log in logs)
                pytest.fail(f"the cluster did not start (ended: {ended}):\n{tails}")
            time.sleep(0.5)
        yield Cluster(master_url, work_dirs, environment, unshared if hidden else None)
    finally:
        for process in reversed(processes):
            stop(process)


def submit_module(flag: str) -> str:
    """What ``python -m horizon_plugins_spark.submit FLAG`` prints, as the README's command."""
    command = [sys.executable, "-m", "horizon_plugins_spark.submit", flag]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def executor_logs(cluster: Cluster) -> dict[Path, str]:
    """The log of every executor the workers started, by its folder: work_dir/app/executor."""
    return {
        log.parent: log.read_text(errors="replace")
        for work_dir in cluster.work_dirs
        for log in work_dir.glob("app-*/*/stderr")
    }


def submit(cluster: Cluster, folder: Path, *conf: str) -> subprocess.CompletedProcess[str]:
    """``horizon run pipeline.toml`` in ``folder``, submitted to ``cluster`` as README says."""
    command = [
        str(Path(sys.executable).with_name("spark-submit")),
        *("--master", cluster.master_url),
        *("--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m"),
        *(option for setting in conf for option in ("--conf", setting)),
        *("--driver-java-options", f"-Dlog4j2.configurationFile={submit_module('--log4j2')}"),
        *(submit_module("--path"), "run", "pipeline.toml"),
    ]
    return subprocess.run(
        command,
        cwd=folder,
        env=cluster.environment,
        capture_output=True,
        text=True,
        timeout=SUBMIT_SECONDS,
    )


def test_spark_submit_to_a_standalone_cluster_builds_the_local_engines_timeline(
    tmp_path: Path, cluster: Cluster
) -> None:
    source = tmp_path / "rows.parquet"
    generated_rows(source, ROWS)
    local = build(tmp_path, source, "local")
    output_dir = tmp_path / "on-cluster"
    (tmp_path / "pipeline.toml").write_text(toml_text(parity_config(output_dir, source, "spark")))
    earlier = executor_logs(cluster)
    result = submit(cluster, tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((output_dir / "manifest.json").read_text())
    assert manifest["stages"]["timeline"]["details"]["engine"] == "spark"
    assert_same_timeline(local, read_timeline(output_dir, manifest))
    # The executors were the workers' processes, one on each, and they ran the job's tasks.
    logs = {folder: log for folder, log in executor_logs(cluster).items() if folder not in earlier}
    assert {folder.parent.parent for folder in logs} == set(cluster.work_dirs)
    assert len({folder.parent.name for folder in logs}) == 1, "one application"
    assert any("Finished task" in text for text in logs.values()), logs


def test_a_run_folder_the_executors_cannot_see_is_named_in_one_line(
    tmp_path: Path, cluster: Cluster
) -> None:
    if cluster.unshared is None:
        pytest.skip("no mount namespace (unshare) here to keep the workers from a folder")
    source = tmp_path / "rows.parquet"
    generated_rows(source, 1_000)
    output_dir = cluster.unshared / "run"
    (tmp_path / "pipeline.toml").write_text(toml_text(parity_config(output_dir, source, "spark")))
    result = submit(cluster, tmp_path, "spark.task.maxFailures=1")
    # spark-submit passes the Python driver's stderr on to its own stdout.
    printed = result.stdout + result.stderr
    assert result.returncode == 1, printed
    assert "Traceback" not in printed, printed
    unreadable = f"cannot read {output_dir / 'source' / 'rows.parquet'}"
    (message,) = [line for line in printed.splitlines() if unreadable in line] or [printed]
    assert message.startswith("error: "), message
    assert "shared mount" in message and cluster.master_url in message, message
