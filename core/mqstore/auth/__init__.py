"""Users, secrets and permissions (RocketMQ ACL 2.0's shape): who may publish, subscribe or administer
which topics and groups. No gRPC here: mqstore_rpc.auth reads the credentials of a call and asks
:class:`mqstore.auth.authority.Authority`; the users and rules are stored by mqstore.meta.auth."""
