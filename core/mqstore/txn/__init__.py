"""The Transaction service's domain (no grpc): half messages, commit and rollback, OP records batched
Nagle-style, the half-message cache and check-back, each decision exactly once also when an append's
outcome is unknown. services/txn/ composes it and serves it over gRPC. The records' layout (properties,
system topics) is records.py.

  records.py      the records' layout and the rules of the internal way into the log (the store's check)
  config.py       TxnConfig
  table.py        the transactions the service knows and their states
  projection.py   the table as the follower's projection of the log
  coordinator.py  Prepare, Commit, Rollback: the state machine
  transact.py     Transact streams: their limit, one-way and carried ends
  onloop.py       the calls of a grpc.aio port: on its event loop or on a thread, a refused Commit retried
  indoubt.py      appends of unknown outcome, settled from the log
  appender.py     Appends to the commit log, merged across concurrent callers (direct in Local mode)
  opbatch.py      OP records batched by size and time (RIP-50)
  cache.py        the LRU cache of half messages
  checkback.py    the check-back streams: sessions, their readers and the answers' deciders
  checker.py      the checker duty, parking
  operations.py   ListOpen, Show, ForceResolve, ListAudit, Stats
  journal.py, snapshot.py, persist.py   the checkpoint file, its records and its duty
"""
