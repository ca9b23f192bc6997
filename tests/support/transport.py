"""How a test rig's servers listen and its clients connect: plaintext, TLS (the servers' certificate of a
throwaway CA, mqstore_rpc.tls_certs: the ``certs`` fixture) or mutual TLS (a client certificate of that CA
required). Issue 32's attacks run over each: what authorization refuses in plaintext it refuses over TLS.

Immutable, so thread-safe.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import grpc

from mqstore_rpc.tls import ClientTls, ServerTls, open_channel

TRANSPORTS = ("plaintext", "tls")   # what every attack rig runs over; "mtls" where a test says so


@dataclass(frozen=True)
class Transport:
    kind: str = "plaintext"              # plaintext | tls | mtls
    certs: pathlib.Path | None = None    # the CA's directory (tls_certs.make_ca): tls and mtls

    def __post_init__(self) -> None:
        assert self.kind in ("plaintext", "tls", "mtls"), self.kind
        assert self.kind == "plaintext" or self.certs is not None, f"{self.kind} needs the certs fixture"

    def server(self) -> ServerTls | None:
        """ServerConfig.tls of every server of the rig (None: plaintext)."""
        if self.kind == "plaintext":
            return None
        return ServerTls.from_files(str(self.certs / "server.pem"), str(self.certs / "server.key"),
                                    str(self.certs / "ca.pem") if self.kind == "mtls" else "")

    def client(self) -> ClientTls | None:
        """Peers.tls of a client of the rig: the CA, and over mutual TLS the client certificate."""
        if self.kind == "plaintext":
            return None
        if self.kind == "tls":
            return ClientTls.from_files(str(self.certs / "ca.pem"))
        return ClientTls.from_files(str(self.certs / "ca.pem"), str(self.certs / "client.pem"),
                                    str(self.certs / "client.key"))

    def channel(self, port: int) -> grpc.Channel:
        """A channel to the rig's server on ``port`` (127.0.0.1, which the servers' certificate names)."""
        return open_channel(f"127.0.0.1:{port}", self.client())


PLAINTEXT = Transport()
