"""The test run's scratch folder: made by ``tests/conftest.py`` when the run starts, named in
the environment (so processes the tests start find it too) and removed when the run ends.  For
what tests, and the programs they start (Spark's JVMs, Chromium), would otherwise leave in
/tmp: a process a test SIGKILLs never cleans up after itself."""

from __future__ import annotations

import os
import tempfile

#: The variable that names the folder.
ENV = "TXMQ_TEST_SCRATCH"


def root() -> str | None:
    """The run's scratch folder; None outside a test run (a fuzzing run of the targets)."""
    return os.environ.get(ENV)


def mkdtemp(prefix: str) -> str:
    """A new folder in the run's scratch folder (in the temporary folder outside a run)."""
    return tempfile.mkdtemp(prefix=prefix, dir=root())


def jvm_env(scratch: str) -> dict[str, str]:
    """The variables that put Spark's local folders and the JVMs' ``java.io.tmpdir`` (where
    lz4 and snappy unpack their native libraries) in ``scratch``: for spark-submit (drivers)
    and for a standalone cluster's daemons."""
    java = f"-Djava.io.tmpdir={os.path.join(scratch, 'java')}"
    return {
        "SPARK_LOCAL_DIRS": os.path.join(scratch, "spark"),
        "SPARK_SUBMIT_OPTS": java,
        "SPARK_DAEMON_JAVA_OPTS": java,
    }
