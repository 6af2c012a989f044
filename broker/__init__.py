"""The txmq broker: an asyncio TCP server over a durable local store."""
