"""The Compactor service (port 50054): compaction logs of COMPACTION topics, rounds, latest-value reads."""
