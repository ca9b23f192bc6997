"""The object storage tier (issue 36): sealed commit log segments uploaded to object storage, in two phases
recorded in the log itself, deleted locally once uploaded (local retention) and read back transparently.

  module       what it holds
  ------------ ---------------------------------------------------------------------------------------------
  objects      ObjectStore: put-if-absent, range GET, size (HEAD), list, delete, each on the tier's own
               executor with a deadline; every failure Unavailable naming the tier URL
  urls         open_store: the ObjectStore of a tier URL
  local        the ``file://`` backend (the embedded default): atomic create by a temp file and a link
  s3           the ``s3://bucket/prefix`` backend (S3 and S3-compatible stores) through obstore
  config       TierConfig: the commit log's --tier-* flags, and the S3 credentials main() reads from the
               standard AWS_* variables
  ledger       the uploads' metadata: records of the system topic RMQ_SYS_TIER_UPLOADS
               (mqstore.format.tier_upload), a map per segment rebuilt from the topic
  sealed       what is sealed and may be uploaded: the log's final segments, the consume queues' sealed files
  uploader     the duty that uploads sealed segments, on the leader only
  quota        UploadQuota: the uploads' byte rate (--tier-upload-max-bytes-per-second), never below the lag
               over 60 s; the backends ask it before each chunk they send
  reads        TierReader: log bytes of a segment only in the tier, by aligned range GETs (read-ahead) through
               a byte-bounded block cache (CommitLog.remote: Pull and GetMessage(s) below the local log)
  local_retention  the duty that deletes uploaded segments locally (--local-retention-ms/-bytes) and applies
               the total retention to the part of the log only in the tier
  (a replica that starts from the tier plus its leader's local tail is mqstore.replication.tier_join: the
  replication layer uses the tier, the tier never imports replication's parts above its config)
"""
