"""The RocketMQ 5 gateway's gRPC side (its domain: mqstore.gateway), in its two deployments
(mqstore.gateway.log): Cluster mode, the gateway as its own process (:mod:`.main`), and Local mode, the
gateway inside the commit log process (``mqstore-commitlog --gateway-port``, composed by
mqstore_launcher.node). Both compose it with :mod:`.composition`.

  main.py         Cluster mode: the service's settings and its composition on a RemoteLog
  composition.py  builds the gateway (registry, check relay, topic cache, publisher, consuming, duties,
                  servicer) on a LogPort and a Transaction service client; Local mode's compose_local
  local.py        Local mode's flags on the commit log's command line (--gateway-*)
  remote_log.py   LogPort over gRPC (Cluster mode); the in-process one is mqstore.gateway.log.LocalLog
  servicer.py     apache.rocketmq.v2.MessagingService, a thin adapter onto mqstore.gateway
  convert.py, telemetry.py, status.py   the protocol's conversions, Telemetry streams, the status table
  txn_client.py, pop_client.py          the Transaction service and the Consumer service over gRPC
"""
