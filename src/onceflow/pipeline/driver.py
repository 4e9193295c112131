"""How a pipeline process starts its Spark driver on this machine, and what makes that start cheap.

`driver_env()` is the environment a pipeline process gets: Spark on 127.0.0.1, and a driver JVM whose
JIT compiles less (short runs) and which maps its classes from a class-data-sharing archive, if
there is one.

`python -m onceflow.pipeline.driver` (which `make setup` runs) prepares, once per install:
- that archive (the JDK's CDS): the classes a Spark driver loads, recorded from a short local job,
  which a later JVM maps instead of reading and verifying them from Spark's jars again;
- bytecode inside PySpark's own `python/lib/pyspark.zip`, which Spark puts first on the path of
  every Python worker and planner it starts: without it each of them compiles PySpark from source
  (0.3 s instead of 1.0 s to import `pyspark.daemon`, on this machine).
Together, one pipeline run of 400 payments on two cores took 0.71 x the wall time and 0.75 x the
CPU time of the whole machine (three runs each, interleaved). Both are optional: without them Spark
starts as usual.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path
from types import CodeType

from onceflow.sessions import session_members

CLASS_ARCHIVE = Path(sys.prefix) / "share" / "onceflow" / "spark-driver.jsa"
# The driver JVM may still write the archive after its Python process ended.
ARCHIVE_WRITE_TIMEOUT_S = 120.0
SHORT_RUN = "-XX:TieredStopAtLevel=1"  # a JIT that compiles less: a short run starts sooner


def driver_env(archive: Path = CLASS_ARCHIVE) -> dict[str, str]:
    """The environment in which PySpark starts a short run's driver JVM."""
    return _env_with_jvm_options(jvm_options(archive))


def jvm_options(archive: Path = CLASS_ARCHIVE) -> str:
    """A short-lived Spark JVM's options, the driver's or a test cluster's: the class archive if
    there is one (a JVM whose class path differs from the recording's maps none of it, and runs
    as without)."""
    if archive.is_file():
        return f"{SHORT_RUN} -XX:SharedArchiveFile={archive}"
    return SHORT_RUN


def _env_with_jvm_options(java_options: str) -> dict[str, str]:
    return {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_SUBMIT_ARGS": f"--driver-java-options '{java_options}' pyspark-shell",
    }


def compile_pyspark_zip(zip_path: Path) -> bool:
    """Adds each module's bytecode next to its source in the zip (unchecked hash-based .pyc files,
    which zipimport loads as they are); False when they are there already."""
    with zipfile.ZipFile(zip_path) as source:
        names = set(source.namelist())
        if "pyspark/__init__.pyc" in names:
            return False
        partial = zip_path.with_suffix(".zip.partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as target, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PySpark's own tests hold a few SyntaxWarnings
            for entry in source.infolist():
                data = source.read(entry)
                target.writestr(entry, data)
                if entry.filename.endswith(".py") and f"{entry.filename}c" not in names:
                    code = compile(data, entry.filename, "exec", dont_inherit=True)
                    target.writestr(f"{entry.filename}c", _unchecked_pyc(code, data))
    os.replace(partial, zip_path)
    return True


def _unchecked_pyc(code: CodeType, source: bytes) -> bytes:
    """PEP 552's layout: magic, flags (bit 0: hash-based; bit 1 unset: source not checked), the
    source's hash, then the code object."""
    flags = (1).to_bytes(4, "little")
    return importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source) + marshal.dumps(code)


def record_class_archive(archive: Path = CLASS_ARCHIVE) -> None:
    """Runs a short local Spark job whose driver JVM writes the archive as it exits."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    env = {**os.environ, **_env_with_jvm_options(f"{SHORT_RUN} -XX:ArchiveClassesAtExit={partial}")}
    job = subprocess.Popen(
        [sys.executable, "-m", "onceflow.pipeline.driver", "--short-job"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    _, errors = job.communicate(timeout=300)
    if job.returncode != 0:
        raise RuntimeError(f"the Spark job failed: {errors.strip()[-2000:]}")
    # The JVM, in the job's session, writes the archive as it exits, which may be after the job.
    deadline = time.monotonic() + ARCHIVE_WRITE_TIMEOUT_S
    while session_members(job.pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the driver JVM still runs after {ARCHIVE_WRITE_TIMEOUT_S:g} s")
        time.sleep(0.2)
    if not partial.is_file():
        raise RuntimeError("the driver JVM wrote no class archive")
    os.replace(partial, archive)


def _short_job() -> None:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.range(10).count()
    spark.stop()


def main() -> int:
    if sys.argv[1:] == ["--short-job"]:
        _short_job()
        return 0
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        print("no PySpark here: nothing to prepare")
        return 0
    zip_path = Path(spec.origin).parent / "python" / "lib" / "pyspark.zip"
    if zip_path.is_file() and compile_pyspark_zip(zip_path):
        print(f"compiled {zip_path}")
    record_class_archive()
    print(f"recorded {CLASS_ARCHIVE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
