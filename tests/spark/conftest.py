"""One local Spark session for the in-process tests of the onceflow data source."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import onceflow.spark
from onceflow import EmbeddedBroker
from onceflow.pipeline.driver import driver_env
from tests.conftest import FAST_JOINS


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.update(driver_env())
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.reuse", "true")
        .config(*onceflow.spark.DAEMON_MODULE)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    onceflow.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """The suite's broker, with metrics: some tests count the requests that clients send."""
    with EmbeddedBroker(tmp_path / "data", config=FAST_JOINS, metrics_port=0) as running:
        yield running
