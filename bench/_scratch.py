"""Scratch folders for the benchmarks: made in the temp folder, removed when the run ends.

A run that raised keeps its folder for a look, and so does every run with ``TXMQ_BENCH_KEEP=1``
in the environment; either way one line on stderr names it.  Only the standard library here:
a bench can import it before it imports txmq (or sets the switches that choose how).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

KEEP_ENV = "TXMQ_BENCH_KEEP"


@contextlib.contextmanager
def scratch_dir(prefix: str, keep: str | None = None, *, dir: str | None = None) -> Iterator[Path]:
    """A new folder (``tempfile.mkdtemp(prefix=prefix, dir=dir)``) for the block, removed at its
    end unless the block raised or ``TXMQ_BENCH_KEEP=1``.  ``keep``: a folder the user gave
    (``--store``, ``--dir``): yielded as it is and never removed.  Whatever the block started in
    the folder (brokers, etcd members) must have stopped when the block ends."""
    if keep:
        yield Path(keep)
        return
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=dir))
    why: str | None = None
    try:
        yield path
    except SystemExit as e:
        if e.code not in (0, None):
            why = f"the run exited {e.code}"
        raise
    except BaseException as e:  # a failure, Ctrl-C: the folder stays for a look
        why = f"the run raised {type(e).__name__}"
        raise
    finally:
        if why is None and os.environ.get(KEEP_ENV, "") not in ("", "0"):
            why = f"{KEEP_ENV} is set"
        if why is None:
            shutil.rmtree(path, ignore_errors=True)
        else:
            print(f"kept {path} ({why})", file=sys.stderr, flush=True)
