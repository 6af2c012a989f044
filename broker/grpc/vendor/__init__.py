"""Third-party and generated code of the gRPC front end, kept apart from txmq's own.

* ``protos/`` - the RocketMQ 5 protobuf definitions, from apache/rocketmq-apis (see NOTICE);
* :mod:`.v2` - the protobuf/gRPC modules generated from them (see ``../codegen.py``).
"""
