"""The driver script for ``spark-submit``: the ``horizon`` command, inside a Spark application.

    quiet="-Dlog4j2.configurationFile=$(python -m horizon_plugins_spark.submit --log4j2)"
    spark-submit --master yarn --driver-java-options "$quiet" \\
        "$(python -m horizon_plugins_spark.submit --path)" run pipeline.toml

spark-submit runs a Python file, not a console script, so this file stands in for ``horizon``
and takes the same arguments. It starts the SparkSession first, from what spark-submit was
given (``--master``, ``--conf``, ``spark-defaults.conf``); the pipeline's Spark components then
find that session active and use it, so ``[timeline.spark]`` applies only outside spark-submit.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Start the session spark-submit configured, then run ``horizon`` with this script's args."""
    from importlib.metadata import entry_points

    from pyspark.sql import SparkSession

    session = SparkSession.builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    (command,) = entry_points(group="console_scripts", name="horizon")
    command.load()(prog_name="horizon")


def where(what: str) -> str:
    """``--path``: this file, for spark-submit; ``--log4j2``: the quiet log4j2 config's URI."""
    from horizon_plugins_spark.session import quiet_log4j2

    return __file__ if what == "--path" else quiet_log4j2()


if __name__ == "__main__":
    if sys.argv[1:] in (["--path"], ["--log4j2"]):
        sys.stdout.write(where(sys.argv[1]) + "\n")
    else:
        main()
