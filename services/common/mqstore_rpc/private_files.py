"""What a service process does at start so that its files are its own (mqstore_rpc.service.run; the
launcher's main too):

* :func:`private_umask`: umask 077, so that everything the process creates is readable by its user only:
  data directories 0700, databases (SQLite's metadata.db, auth.db and their -wal and -shm files, which
  SQLite creates with the database file's mode), commit log segments, consume queues, checkpoints and
  logs 0600. Files made before (by a version that did not set it) keep their mode: nothing is rewritten,
  and :func:`warn_open_data_dir` says once at start that the data directory is open to others;
* :func:`make_data_dir`: the data directory, created 0700 when missing (and its entry made durable,
  the creation rule of mqstore.fs);
* :func:`warn_secrets_in_data_dir`: one event ``security.secret_in_data_dir`` when a secret that protects
  the data sits inside it (the kek of SDK secret keys, ``--auth-kek-file``; the internal token file the
  launcher keeps; a TLS CA key): whoever can read the directory (a backup, a copied volume) then holds
  both the sealed data and its key. The README (*Authentication and permissions*) says where to keep them.

The directories looked in: the service's data directory and the directory of the auth database (a SQLite
``auth_url``), the database these secrets protect.

Stateless functions; call them from the main thread before the server starts.
"""

from __future__ import annotations

import os
import pathlib
import stat
from typing import Iterable

import structlog
from mqstore import fs

from mqstore_rpc.server import ServerConfig

log = structlog.get_logger("mqstore_rpc.files")

UMASK = 0o077
DIR_MODE = 0o700
# Secrets found by name in a directory looked in: what `make run` (mqstore_launcher) and
# mqstore_rpc.tls_certs write there.
KNOWN_SECRETS = (("auth_kek", "auth.kek"), ("internal_token", "internal-token"), ("tls_ca_key", "tls/ca.key"),
                 ("tls_ca_key", "ca.key"))


def private_umask() -> int:
    """Set umask 077 for this process; returns the one it replaces."""
    return os.umask(UMASK)


def make_data_dir(data_dir: pathlib.Path | None) -> None:
    """Create ``data_dir`` mode 0700 when it is missing (an existing one is left as it is)."""
    if data_dir is None or data_dir.exists():
        return
    for created in fs.make_dirs(data_dir):
        os.chmod(created, DIR_MODE)


def warn_open_data_dir(data_dir: pathlib.Path | None) -> None:
    """One ``security.data_dir_open`` event when the data directory is readable by its group or others
    (made before the services set their umask): its files may be too."""
    if data_dir is None or not data_dir.is_dir():
        return
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode & 0o077:
        log.warning("security.data_dir_open", data_dir=str(data_dir), mode=oct(mode),
                    advice=f"chmod -R go-rwx {data_dir}: files made before mqstore set umask 077 keep their mode")


def _sqlite_dir(url: str) -> pathlib.Path | None:
    prefix = "sqlite:///"
    if not url.startswith(prefix) or url == prefix:
        return None
    return pathlib.Path(url[len(prefix):].split("?", 1)[0]).parent


def _inside(path: pathlib.Path, directory: pathlib.Path) -> bool:
    try:
        path.resolve().relative_to(directory.resolve())
    except ValueError:
        return False
    return True


def secrets_in(directories: Iterable[pathlib.Path], server: ServerConfig) -> list[dict[str, str]]:
    """The secrets inside any of ``directories``: each as {kind, path, directory}."""
    dirs = [d for d in dict.fromkeys(directories) if d.is_dir()]
    candidates: list[tuple[str, pathlib.Path]] = []
    if server.auth.kek_file and (server.auth.enabled or pathlib.Path(server.auth.kek_file).exists()):
        candidates.append(("auth_kek", pathlib.Path(server.auth.kek_file)))
    candidates += [(kind, d / name) for d in dirs for kind, name in KNOWN_SECRETS if (d / name).exists()]
    found: dict[pathlib.Path, dict[str, str]] = {}
    for kind, path in candidates:
        for directory in dirs:
            if path.resolve() not in found and _inside(path, directory):
                found[path.resolve()] = {"kind": kind, "path": str(path.resolve()), "directory": str(directory)}
    return list(found.values())


def warn_secrets_in_data_dir(data_dir: pathlib.Path | None, server: ServerConfig) -> list[dict[str, str]]:
    """One ``security.secret_in_data_dir`` event listing the secrets inside the data directory or beside
    the auth database (none: no event); returns them."""
    directories = [d for d in (data_dir, _sqlite_dir(str(server.auth.url.reveal()))) if d is not None]
    found = secrets_in(directories, server)
    if found:
        log.warning("security.secret_in_data_dir", secrets=found,
                    advice="keep the kek (--auth-kek-file), the internal token and the TLS CA key outside the "
                           "data directory and the auth database's directory, readable by the services' user "
                           "only: a copy of the directory (a backup, a volume) then holds no key to its secrets "
                           "(README, Authentication and permissions)")
    return found
