"""The Transaction service's gRPC side, shared by both deployments: its servicer, its composition on a
TxnLog (mqstore.txn.log) and the TxnLog over gRPC (Cluster mode)."""
