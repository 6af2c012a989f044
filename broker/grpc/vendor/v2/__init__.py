"""Generated protobuf and gRPC modules of apache.rocketmq.v2 (see ../../codegen.py)."""
