"""Compaction of COMPACTION topics (no grpc, no pyspark): shared by the Compactor service and the Spark job.

  key.py          the compaction key: the one definition routing (the commit log) and compaction use
  offset_map.py   key digest -> latest queue offset, within a memory budget
  qlog.py         one queue's compaction log: segments + sparse queue index, append, read, recovery
  writer.py       the one round writer both engines call (positions, padding, index)
  rounds.py       a round: select sealed segments, map a prefix, rewrite survivors, install, checkpoint
  policy.py       triggers (dirty ratio, min/max lag), tombstone retention, quarantine backoff
"""
