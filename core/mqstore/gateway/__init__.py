"""The RocketMQ 5 gateway's domain (no grpc, no protobuf): what the gateway decides between the official
RocketMQ 5 clients and mqstore's services. services/gateway/ composes it and serves it as
apache.rocketmq.v2.MessagingService; services/gateway/README.md has the contract.

  config.py       GatewayConfig
  clients.py      the clients by x-mq-client-id: type, published topics, group, Telemetry outbox; TTL, bound
  publishing.py   a v2 message as an mqstore message (UNIQ_KEY, tag, keys, message group), the topic cache,
                  sends as Append or Transaction.Prepare
  consuming.py    receives and acks as pop consumption (long poll, invisible time, filters, handles)
  checkback.py    one CheckBack stream per published topic, checks relayed onto producers' Telemetry
"""
