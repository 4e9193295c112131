"""The Spark driver's start-up aids: bytecode in a zip that zipimport loads, and the JVM options."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

from onceflow.pipeline.driver import compile_pyspark_zip, driver_env


def imported_from(zip_path: Path) -> list[str]:
    """`__file__` of a package and module imported from the zip, and the module's value."""
    probe = "import pkg.mod; print(pkg.__file__); print(pkg.mod.__file__); print(pkg.mod.VALUE)"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(zip_path)},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def test_modules_load_as_bytecode_from_the_compiled_zip(tmp_path: Path) -> None:
    zip_path = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(zip_path, "w") as archive:
        archive.writestr("pyspark/__init__.py", "")
        archive.writestr("pkg/__init__.py", "")
        archive.writestr("pkg/mod.py", "VALUE = 6 * 7\n")
    # Before: compiled from source at each import.
    assert [Path(name).suffix for name in imported_from(zip_path)[:2]] == [".py", ".py"]

    assert compile_pyspark_zip(zip_path)
    package, module, value = imported_from(zip_path)
    assert Path(package).suffix == Path(module).suffix == ".pyc" and value == "42"
    assert not compile_pyspark_zip(zip_path), "a second pass has nothing to add"
    with zipfile.ZipFile(zip_path) as archive:
        assert archive.read("pkg/mod.py") == b"VALUE = 6 * 7\n"


def test_the_driver_maps_the_class_archive_only_when_there_is_one(tmp_path: Path) -> None:
    archive = tmp_path / "spark-driver.jsa"
    without = shlex.split(driver_env(archive)["PYSPARK_SUBMIT_ARGS"])
    assert without == ["--driver-java-options", "-XX:TieredStopAtLevel=1", "pyspark-shell"]
    archive.write_bytes(b"classes")
    with_archive = shlex.split(driver_env(archive)["PYSPARK_SUBMIT_ARGS"])
    assert with_archive[1] == f"-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile={archive}"
    assert driver_env(archive)["SPARK_LOCAL_IP"] == "127.0.0.1"
