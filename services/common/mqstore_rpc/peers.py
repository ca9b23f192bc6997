"""How a process calls mqstore's services: TLS and credentials in one place.

A :class:`Peers` is part of every service's configuration (``ServerConfig.peers``: the CommitLog client
of a follower, a compactor replica's channel to its primary) and of the CLI's: ``channel(address)``
opens a channel with TLS when a CA is configured (mqstore_rpc.tls) and adds the bearer credentials to
every call when a user is set (mqstore_rpc.auth). A service calls the others as the services' own
identity, user ``service`` with MQSTORE_INTERNAL_TOKEN as its secret, whenever that token is set (a
server with authentication off ignores it).

Immutable, so thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import grpc

from mqstore_rpc.auth import METADATA_KEY, BearerToken, token
from mqstore_rpc.secret import Secret
from mqstore_rpc.tls import ClientTls, channel_options, open_channel


@dataclass(frozen=True)
class Peers:
    tls: ClientTls | None = None
    user: str = ""
    secret: Secret = Secret()

    def interceptors(self) -> tuple[BearerToken, ...]:
        return (BearerToken(self.user, str(self.secret.reveal())),) if self.user else ()

    def channel(self, address: str, options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
        return open_channel(address, self.tls, options, self.interceptors())

    def aio_channel(self, address: str, options: Sequence[tuple[str, object]] = ()) -> grpc.aio.Channel:
        """A grpc.aio channel (open it on the loop that uses it) with this TLS; its calls carry
        :meth:`metadata` themselves (grpc.aio takes no synchronous interceptors)."""
        options = channel_options(options)
        if self.tls is None:
            return grpc.aio.insecure_channel(address, options=options)
        return grpc.aio.secure_channel(address, self.tls.credentials(), options=[*options, *self.tls.options()])

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The credentials as call metadata (what :meth:`interceptors` adds to a synchronous channel's calls)."""
        return ((METADATA_KEY, token(self.user, str(self.secret.reveal()))),) if self.user else ()
