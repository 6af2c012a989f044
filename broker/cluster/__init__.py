"""Cluster mode: broker groups replicated by the brokers, coordinated by etcd (see
docs/cluster.md).  Nothing here is imported by a single-node broker."""
