"""One SparkSession for every Spark test (a session costs seconds here), in local mode on loopback."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from mqstore_spark.round_job import session
    spark = session("local[2]", "mqstore-tests")
    yield spark
    spark.stop()
