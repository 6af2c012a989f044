"""A small web console for operators: ``txmq console`` serves it (see docs/console.md).

Server-rendered HTML over the SDK's admin client (:class:`txmq.client.admin.AsyncAdminClient`):
the broker's state and charts over time, topics, consumer groups and their lag (with offset
resets), transactions (with commit, roll back and resume), messages, key search, traces and
dead letters (with resend).  With a users file people sign in with the console's own accounts
(viewer or operator); without one and with the broker's ACL on, with their broker accounts, and
what they do is signed with them."""

from .server import Console
from .web import Sessions

__all__ = ["Console", "Sessions"]
