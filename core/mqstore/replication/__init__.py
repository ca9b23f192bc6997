"""Replication of the commit log (issue 17): epochs, truncation, the in-sync set, SYNC-replicated acks,
the leader's and the replica's sides of the stream, and the election through etcd. No grpc here: the
stream and etcd are reached through ports (mqstore_rpc / commitlog_service implement them). The protocol
is written down in README.md beside this file."""
