"""One SparkSession for every Spark test (a session costs seconds here), in local mode on loopback."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from mqstore_spark.round_job import session
    from pyspark import SparkContext
    spark = session("local[2]", "mqstore-tests")
    yield spark
    gateway = SparkContext._gateway
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if proc is not None:  # the JVM exits when its stdin closes; close the pipe ourselves (no ResourceWarning)
        gateway.shutdown()
        proc.stdin.close()
        proc.wait(60)
