"""A small web console for operators: ``txmq console`` serves it (see docs/console.md).

Server-rendered HTML over the SDK's admin client (:class:`txmq.client.admin.AsyncAdminClient`):
the broker's state, topics, consumer groups and their lag, transactions (with commit, roll back
and resume) and single messages.  With the broker's ACL on, operators sign in, and what they do
is signed with their own account."""

from .server import Console, Sessions

__all__ = ["Console", "Sessions"]
