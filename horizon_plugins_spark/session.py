"""The SparkSession every Spark component of this plugin runs on.

One session per process: a session already active (the engine called from inside a Spark job,
or from ``spark-submit``, or a test's shared session) is used as it is, so that the cluster's
own settings win; otherwise one is started from ``[... .spark] master`` and ``conf``. Starting a
session takes seconds, so it is left running for the next stage or run of the same process.

pyspark is imported inside the functions: ``horizon plugins`` imports this module and must
stay fast.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from horizon_engine import ComponentConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

QUIET_LOG4J2 = """\
# Written by horizon_plugins_spark: Spark's console shows errors only.
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
# Spark prints 'Setting default log level to "WARN"' unless these match the root level.
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
"""
"""A log4j2 configuration that keeps Spark's startup and job warnings off the console."""


class SparkOptions(ComponentConfig):
    """How to start a SparkSession when none is active: ``[timeline.spark]``, ``[source.spark]``."""

    master: str = "local[*]"
    """Spark master URL: local[*], local[4], yarn, spark://host:7077, k8s://..."""
    conf: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Spark settings, e.g. {"spark.executor.memory" = "8g"}; used only when starting a session."""
    app_name: str = "horizon-engine"
    """The application name the Spark UI and the cluster manager show."""


def spark_session(options: SparkOptions) -> SparkSession:
    """The active SparkSession, or a new one started from ``options``."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    conf = {key: _conf_text(value) for key, value in options.conf.items()}
    if options.master.startswith("local"):
        # Spark otherwise binds to the host's first interface, which sandboxes and laptops on
        # VPNs often cannot reach; a local session needs nothing but the loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf.setdefault("spark.ui.showConsoleProgress", "false")
    conf.setdefault("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={quiet_log4j2()}")
    builder = SparkSession.builder.master(options.master).appName(options.app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _conf_text(value: str | int | float | bool) -> str:
    """A TOML value as Spark reads it: booleans lower case, numbers as written."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def quiet_log4j2() -> str:
    """A file URI of ``QUIET_LOG4J2``, written once per content to the temporary folder.

    Written at run time rather than shipped as package data, so that it is there however the
    package was installed.
    """
    digest = hashlib.sha256(QUIET_LOG4J2.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"horizon-spark-log4j2-{digest}.properties"
    if not path.exists():
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(QUIET_LOG4J2, encoding="utf-8")
        os.replace(temporary, path)
    return path.as_uri()


def hadoop_path(path: Path, reading: bool = False) -> str:
    """A run's local path as Spark must be given it.

    ``file:`` keeps a cluster whose default file system is HDFS from looking there (the run's
    folder is local, or a shared mount), and a path read is a glob pattern to Hadoop, so its
    glob characters are escaped: ``runs/exp[1]`` is a folder name, not a character class.
    """
    text = str(path.resolve())
    if reading:
        text = re.sub(r"([\\*?\[\]{}])", r"\\\1", text)
    return f"file:{text}"
