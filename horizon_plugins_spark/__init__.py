"""Horizon Engine on Spark: the ``spark_table`` source, the Spark timeline and Spark-side sampling.

Registered through the ``horizon`` entry point like any third-party plugin; its components
arrive with the timeline work and register nothing yet.
"""
