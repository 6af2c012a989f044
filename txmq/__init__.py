"""txmq: a transactional message broker in the Apache RocketMQ tradition."""

__version__ = "0.1.0"
