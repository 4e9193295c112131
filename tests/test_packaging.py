"""`pip install onceflow` is the broker, the operators' tools and the lab; the rest needs an extra, and
using it without the extra is one line that names it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import onceflow

ROOT = Path(__file__).parent.parent
EXTRAS = ("pyspark", "pandas", "pyarrow", "psycopg", "kazoo")
CORE_MODULES = [
    "onceflow.cli",
    "onceflow.embedded",
    "onceflow.admin.commands",
    "onceflow.lab.command",
    "onceflow.lab.runner",
    "onceflow.lab.workload",
    "onceflow.pipeline.command",
    "onceflow.demo",
    "onceflow.stores",
]


def without_extras(code: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a Python where importing any extra's package fails, as if it were not installed."""
    blocked = "".join(f"sys.modules[{name!r}] = None\n" for name in EXTRAS)
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{blocked}{code}"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_the_core_modules_import_without_any_extra() -> None:
    run = without_extras("".join(f"import {module}\n" for module in CORE_MODULES))
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("onceflow.spark", "onceflow.spark needs PySpark: pip install 'onceflow[spark]'"),
        ("onceflow.spark.sink", "onceflow.spark needs PySpark: pip install 'onceflow[spark]'"),
        ("onceflow.pipeline.job", "onceflow pipeline run needs PySpark: pip install 'onceflow[spark]'"),
        (
            "onceflow.stores.postgres",
            "onceflow's PostgreSQL store needs psycopg: pip install 'onceflow[postgres]'",
        ),
    ],
)
def test_importing_a_module_without_its_extra_names_the_extra(module: str, message: str) -> None:
    run = without_extras(
        f"from onceflow.extras import MissingExtraError\n"
        f"try:\n    import {module}\n"
        f"except MissingExtraError as error:\n    print(error)\n"
    )
    assert run.stdout.strip() == message, run.stderr


def cli_without_extras(*args: str) -> subprocess.CompletedProcess[str]:
    return without_extras(f"from onceflow.cli import main\nsys.exit(main({list(args)!r}))")


def test_the_cli_prints_a_missing_extra_as_one_line_and_exits_1(tmp_path: Path) -> None:
    common = ["--bootstrap", "127.0.0.1:1", "--checkpoint", str(tmp_path / "ckpt")]
    spark = cli_without_extras("pipeline", "run", *common, "--db", str(tmp_path / "results.db"))
    assert (spark.returncode, spark.stderr) == (
        1,
        "onceflow pipeline run needs PySpark: pip install 'onceflow[spark]'\n",
    )
    postgres = cli_without_extras("pipeline", "run", *common, "--db", "postgresql://app@127.0.0.1:1/db")
    assert (postgres.returncode, postgres.stderr) == (
        1,
        "onceflow's PostgreSQL store needs psycopg: pip install 'onceflow[postgres]'\n",
    )
    demo = cli_without_extras("demo", "--short", "--report-dir", str(tmp_path / "report"))
    assert (demo.returncode, demo.stderr) == (1, "onceflow demo needs PySpark: pip install 'onceflow[lab]'\n")
    data = str(tmp_path / "data")
    broker = cli_without_extras("broker", "--data-dir", data, "--zookeeper", "127.0.0.1:1")
    assert (broker.returncode, broker.stderr) == (
        1,
        "onceflow broker --zookeeper needs kazoo: pip install 'onceflow[cluster]'\n",
    )


def test_version() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert (run.returncode, run.stdout) == (0, f"onceflow {onceflow.__version__}\n")


@pytest.mark.wheel
@pytest.mark.timeout(600)
def test_the_wheel_alone_runs_the_broker(tmp_path: Path) -> None:
    """Builds the wheel, installs it with its core dependencies only into a fresh venv, and runs it."""
    source = tmp_path / "source"  # a copy, so the build leaves nothing in the work tree
    shutil.copytree(
        ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("onceflow-*.whl")
    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    subprocess.run(
        [bin_dir / "pip", "install", "-q", "-c", ROOT / "constraints.txt", wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )

    version = subprocess.run([bin_dir / "onceflow", "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout == f"onceflow {onceflow.__version__}\n"
    compiled = [bin_dir / "python", "-c", "import onceflow.records as r; print(r.COMPILED)"]
    assert subprocess.run(compiled, capture_output=True, text=True, timeout=60).stdout == "True\n"
    spark = subprocess.run(
        [bin_dir / "python", "-c", "import onceflow.spark"], capture_output=True, text=True, timeout=60
    )
    assert "onceflow.spark needs PySpark: pip install 'onceflow[spark]'" in spark.stderr

    broker = subprocess.Popen(
        [bin_dir / "onceflow", "broker", "--listen", "127.0.0.1:0", "--data-dir", tmp_path / "data"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert broker.stdout is not None
        assert broker.stdout.readline().startswith("onceflow broker listening on 127.0.0.1:")
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=60) == 0
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait(timeout=30)
