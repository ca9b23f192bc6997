"""TLS for every gRPC server and client of mqstore, and the one way to open a channel.

Servers (settings ``--tls-cert``, ``--tls-key``, ``--tls-client-ca``; env ``MQSTORE_TLS_CERT`` ...):
with a certificate and key the server speaks TLS only (a plaintext client fails its handshake); with a
client CA too it requires a client certificate signed by that CA (mutual TLS). Without them it speaks
plaintext, the embedded default on 127.0.0.1.

Clients (``--tls-ca``, ``--tls-client-cert``, ``--tls-client-key``, ``--tls-server-name``; env
``MQSTORE_TLS_CA`` ...): the services following each other, the CLI, the launcher, the health check and
the benchmarks all open their channels with :func:`open_channel`, which gives a TLS channel when a CA
is set (the server's certificate must chain to it and name the host, or ``--tls-server-name``), with
the client certificate when one is set, and a plaintext channel otherwise. Credentials for
authentication (mqstore_rpc.auth) ride on the channel as call metadata.

Files are read once, when the configuration is built: a missing or unreadable file is a configuration
error (exit 2) naming the setting, not a failed handshake later.

Every channel resolves its host name again at most DNS_REFRESH_MS after a connection to it fails
(:func:`channel_options`; grpc's default waits 30 s between resolutions): a container started again may come
back at another address (Docker gives it the first free one), and a channel that kept the old one reached
nothing, or another container, for up to 30 s. Seen in `make compose-check-chaos`: a replica's channel to a
restarted node elected leader was refused for 13 s while a fresh process reached it at once.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Sequence

import grpc

from mqstore.errors import InvalidArgument

from mqstore_rpc.secret import Secret


def _read(path: str | pathlib.Path, setting: str) -> bytes:
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN" not in data:
        raise InvalidArgument(f"{setting}: {path} is not a PEM file (no -----BEGIN line)")
    return data


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate chain and key (PEM), and the CA its clients' certificates must chain to
    (mutual TLS) when ``client_ca_file`` is set. Build it with :meth:`from_files` (which reads them)."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""
    cert_pem: Secret = Secret()          # the contents, kept out of logs (the key is a secret)
    key_pem: Secret = Secret()
    client_ca_pem: Secret = Secret()

    @classmethod
    def from_files(cls, cert_file: str, key_file: str, client_ca_file: str = "") -> "ServerTls":
        if not cert_file or not key_file:
            raise InvalidArgument("TLS needs both tls_cert (--tls-cert / MQSTORE_TLS_CERT) and tls_key "
                                  "(--tls-key / MQSTORE_TLS_KEY)")
        ca = Secret(_read(client_ca_file, "tls_client_ca")) if client_ca_file else Secret()
        return cls(cert_file, key_file, client_ca_file, Secret(_read(cert_file, "tls_cert")),
                   Secret(_read(key_file, "tls_key")), ca)

    @property
    def mutual(self) -> bool:
        return bool(self.client_ca_pem)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key_pem.reveal(), self.cert_pem.reveal())],
                                           root_certificates=self.client_ca_pem.reveal() or None,
                                           require_client_auth=self.mutual)


@dataclass(frozen=True)
class ClientTls:
    """How a client checks the server (the CA its certificate chains to) and, for mutual TLS, proves
    itself (a client certificate and key). ``server_name`` overrides the name the server's certificate
    must carry (default: the host of the address)."""

    ca_file: str
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""
    ca_pem: Secret = Secret()
    cert_pem: Secret = Secret()
    key_pem: Secret = Secret()

    @classmethod
    def from_files(cls, ca_file: str, cert_file: str = "", key_file: str = "",
                   server_name: str = "") -> "ClientTls":
        if not ca_file:
            raise InvalidArgument("a TLS client needs tls_ca (--tls-ca / MQSTORE_TLS_CA): the CA that signed "
                                  "the server's certificate")
        if bool(cert_file) != bool(key_file):
            raise InvalidArgument("a client certificate needs both tls_client_cert and tls_client_key")
        cert = Secret(_read(cert_file, "tls_client_cert")) if cert_file else Secret()
        key = Secret(_read(key_file, "tls_client_key")) if key_file else Secret()
        return cls(ca_file, cert_file, key_file, server_name, Secret(_read(ca_file, "tls_ca")), cert, key)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca_pem.reveal(),
                                            private_key=self.key_pem.reveal() or None,
                                            certificate_chain=self.cert_pem.reveal() or None)

    def options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def client_tls(ca_file: str, cert_file: str = "", key_file: str = "", server_name: str = "") -> ClientTls | None:
    """ClientTls from settings, None (plaintext) when no CA is given."""
    if not ca_file:
        if cert_file or key_file:
            raise InvalidArgument("tls_client_cert/tls_client_key need tls_ca too (--tls-ca / MQSTORE_TLS_CA)")
        return None
    return ClientTls.from_files(ca_file, cert_file, key_file, server_name)


DNS_REFRESH_MS = 1000  # a channel whose connection failed looks its host name up again after at most this long
_DNS_OPTION = "grpc.dns_min_time_between_resolutions_ms"


def channel_options(options: Sequence[tuple[str, object]] = ()) -> list[tuple[str, object]]:
    """``options`` with DNS_REFRESH_MS (the module docstring) unless they set it: what every channel gets."""
    options = list(options)
    return options if any(name == _DNS_OPTION for name, _ in options) else [*options, (_DNS_OPTION, DNS_REFRESH_MS)]


def open_channel(address: str, tls: ClientTls | None = None, options: Sequence[tuple[str, object]] = (),
                 interceptors: Sequence[grpc.UnaryUnaryClientInterceptor] = ()) -> grpc.Channel:
    """A channel to ``address``: TLS with ``tls``, plaintext without; ``interceptors`` (the credentials
    of mqstore_rpc.auth) wrap it. Its options are :func:`channel_options`'."""
    options = channel_options(options)
    if tls is None:
        channel = grpc.insecure_channel(address, options=options)
    else:
        channel = grpc.secure_channel(address, tls.credentials(), options=[*options, *tls.options()])
    return grpc.intercept_channel(channel, *interceptors) if interceptors else channel
