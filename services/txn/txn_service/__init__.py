"""The Transaction service's gRPC side (its domain: mqstore.txn), in its two deployments (mqstore.txn.log):
Cluster mode, the service as its own process (:mod:`.main`), and Local mode, the service inside the commit
log process (``mqstore-commitlog --txn-port``, composed by mqstore_launcher.node). Both compose it with
:mod:`.composition`.

  main.py         Cluster mode: the service's settings and its composition on a RemoteTxnLog
  composition.py  the service on a TxnLog (coordinator, follower, check-back, duties, servicer); Local
                  mode's compose_local
  local.py        Local mode's flags on the commit log's command line (--txn-*)
  remote_log.py   the TxnLog over gRPC (Cluster mode); the in-process one is mqstore.txn.log.LocalTxnLog
  servicer.py     mqstore.v1.Transaction, a thin adapter onto mqstore.txn
"""
