"""The Index service's domain (no grpc): keys, UNIQ_KEYs and store times -> physical offsets, in
RocketMQ's IndexFile layout (mqstore.format.index_file) and the RIP-65 compact layout
(mqstore.format.compact_index). services/index/ composes it and serves it over gRPC.

  config.py      IndexConfig (files, slots, entries, checkpoint interval)
  records.py     what is indexed of a message: its keys and UNIQ_KEY under ``topic#key``
  decode.py      Tail frames -> index records (the pure-Python reference); columns.py the compiled path
  follower.py    the Tail follower's projection (mqstore.follow) into the store
  writer.py      puts into the unsealed file; a torn put finished in place
  files.py       one index file's handles (unsealed, sealed, compact, tiered)
  table.py       the files and quarantined ranges, by time and physical offset
  store.py       IndexStore: put, query, seal, checkpoint
  recovery.py    opening the directory after a crash (checkpoint, torn files, damaged ranges)
  lifecycle.py   sealing, conversion to the compact layout, moving to the second tier
  tier.py        the second storage tier: objects on mqstore.tier's ObjectStore (file:// or s3://)
  tier_manifest.py  which tier object holds which file (tier-manifest.snapshot + .log: STARTED, FINISHED)
  upkeep.py      re-indexing damaged ranges from the log; maintenance.py the background duty
  query.py, lookup.py, paging.py   queries, verification against the log, page tokens
  ports.py       what the domain needs of the commit log (a Protocol)
  stats.py, checkpoint.py          counters; the follower checkpoint's use
"""
