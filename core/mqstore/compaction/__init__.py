"""Compaction of COMPACTION topics (no grpc, no pyspark): shared by the Compactor service and the Spark job.
The compaction key itself is mqstore.message_keys (the commit log routes by it; it does not import this package).

  offset_map.py   key digest -> latest position, a flat table of 32 bytes a key (compiled; Python reference)
  qlog.py         one queue's compaction log: segments + sparse queue index, append, read
  qlog_files.py   opening a queue's directory after a crash (install leftovers, torn tails)
  writer.py       the one round writer both engines call (positions, padding, index)
  rounds.py       a round: select sealed segments, bucket the keys, mark superseded records, rewrite once,
                  install
  policy.py       settings, triggers (dirty ratio, min/max lag), tombstone retention, quarantine backoff
  store.py        every queue's log under one directory; rounds per queue, quarantine
  reads.py        compacted Pull, GetLatest, Scan, offsets of compacted queues
  projection.py   Tail frames -> compaction logs: the follower's projection, its checkpoint and gap policy
  replica.py      a replica's copy of its primary's logs: what is kept, dropped and appended
  api.py          the Compactor service's calls (CompactorApi: arguments, a round's engine), RoundDuty
"""
