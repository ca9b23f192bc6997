"""The RocketMQ 5 gateway's gRPC side, shared by its two deployments (mqstore.gateway.log): Cluster mode,
the gateway as its own process (gateway_service), and Local mode, the gateway inside the commit log
process (commitlog_service ``--gateway-port``). Both compose it with :mod:`.composition`.

  composition.py  builds the gateway (registry, check relay, topic cache, publisher, consuming, duties,
                  servicer) on a LogPort and a Transaction service client
  remote_log.py   LogPort over gRPC (Cluster mode); the in-process one is mqstore.gateway.log.LocalLog
  servicer.py     apache.rocketmq.v2.MessagingService, a thin adapter onto mqstore.gateway
  convert.py, telemetry.py, status.py   the protocol's conversions, Telemetry streams, the status table
  txn_client.py, pop_client.py          the Transaction service and the Consumer service over gRPC
"""
