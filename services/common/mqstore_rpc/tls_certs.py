"""A throwaway certificate authority for local TLS: ``python -m mqstore_rpc.tls_certs DIR`` (and ``make
run-tls``, the launcher's ``--tls``, the tests, compose's TLS variant).

Made with the system's ``openssl`` (Debian's openssl package; no Python dependency), in ``DIR``:

  ca.pem, ca.key          the CA (EC P-256, 30 days): what clients trust (``--tls-ca``, grpcurl -cacert)
  server.pem, server.key  the servers' certificate, signed by the CA, for the names in SERVER_NAMES
                          (localhost, 127.0.0.1, ::1 and compose's service names) plus any given
  client.pem, client.key  a client certificate (CN mqstore-client) for mutual TLS (``--tls-client-cert``)

Keys are written mode 0600; ``--readable-keys`` makes them 0644, for a bind mount into containers whose
user (uid 10001) does not own them (docker-compose.secure.yml; never for keys that protect anything).
Existing files are kept (a second run reuses them) unless ``--force``. For local use and tests only:
production certificates come from the operator's own CA.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import Sequence

from mqstore import fs

SERVER_NAMES = ("localhost", "127.0.0.1", "::1", "commitlog", "index", "txn", "compactor", "gateway")
DAYS = 30
FILES = ("ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key")


class CertError(Exception):
    """openssl is missing or failed; the message says which step."""


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise CertError("openssl is not installed (Debian: apt-get install openssl)")
    done = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise CertError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")


def _san(names: Sequence[str]) -> str:
    entries = []
    for name in names:
        kind = "IP" if name.replace(".", "").isdigit() or ":" in name else "DNS"
        entries.append(f"{kind}:{name}")
    return ",".join(entries)


def _key(path: pathlib.Path, cwd: pathlib.Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path.name, cwd=cwd)
    os.chmod(cwd / path.name, 0o600)


def _sign(name: str, subject: str, extensions: str, cwd: pathlib.Path) -> None:
    _key(cwd / f"{name}.key", cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", str(DAYS), "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=cwd)


def make_ca(directory: pathlib.Path, extra_names: Sequence[str] = (), force: bool = False,
            readable_keys: bool = False) -> pathlib.Path:
    """The files of the module docstring in ``directory``; returns it."""
    fs.make_dirs(directory)  # the creation rule (mqstore.fs)
    if not force and all((directory / name).exists() for name in FILES):
        return directory
    with tempfile.TemporaryDirectory(dir=directory, prefix=".make-") as tmp:
        work = pathlib.Path(tmp)
        _key(work / "ca.key", work)
        _openssl("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=mqstore throwaway CA", "-days", str(DAYS),
                 "-sha256", "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
                 "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.pem", cwd=work)
        names = (*SERVER_NAMES, *extra_names)
        _sign("server", "/CN=mqstore", f"subjectAltName={_san(names)}\nextendedKeyUsage=serverAuth\n"
              "basicConstraints=CA:FALSE\n", work)
        _sign("client", "/CN=mqstore-client", "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n", work)
        for name in FILES:
            if readable_keys and name.endswith(".key"):
                os.chmod(work / name, 0o644)
            with open(work / name, "rb") as written:  # openssl wrote it; durable before it takes the name
                os.fsync(written.fileno())
            fs.rename_durably(work / name, directory / name)
    return directory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqstore_rpc.tls_certs",
                                     description="a throwaway CA, server and client certificate for local TLS")
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("--name", action="append", default=[], help="another name for the server certificate")
    parser.add_argument("--force", action="store_true", help="replace existing files")
    parser.add_argument("--readable-keys", action="store_true",
                        help="keys mode 0644, for a bind mount into containers (throwaway keys only)")
    args = parser.parse_args(argv)
    try:
        directory = make_ca(args.directory, args.name, args.force, args.readable_keys)
    except CertError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"certificates in {directory}: ca.pem (trust it), server.pem/.key, client.pem/.key")
    return 0


if __name__ == "__main__":
    sys.exit(main())
