"""txmq: a transactional message broker in the Apache RocketMQ tradition."""

from txmq import _compiled

__version__ = "0.1.0"

# Before any sub-package is imported: which compiled modules may load (TXMQ_PURE_PYTHON=1: none;
# one edited since the build: its .py).  See txmq/_compiled.py.
_compiled.install()
