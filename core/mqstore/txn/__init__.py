"""The Transaction service's domain (no grpc): half messages, commit and rollback, OP records batched
Nagle-style, the half-message cache and check-back. services/txn/ composes it and serves it over gRPC.
The records' layout (properties, system topics) is mqstore.transactions.

  config.py       TxnConfig
  table.py        the transactions the service knows, as the follower's projection of the log
  coordinator.py  Prepare, Commit, Rollback: the state machine
  appender.py     Appends to the commit log, merged across concurrent callers
  opbatch.py      OP records batched by size and time (RIP-50)
  cache.py        the LRU cache of half messages
  checkback.py    the check-back sessions, the checker duty, parking
  operations.py   ListOpen, Show, ForceResolve, Stats
  snapshot.py, persist.py   the table's checkpoint file and its duty
"""
