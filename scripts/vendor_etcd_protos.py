"""Vendor etcd's v3 API protos (Apache-2.0) into protos/etcd/, for the controller's etcd client.

Run on purpose, with an etcd checkout and the tag of the etcd the project installs (Debian bookworm's
etcd-server is 3.4.23): ``python scripts/vendor_etcd_protos.py /path/to/etcd v3.4.23``. It copies
etcdserverpb/rpc.proto, mvccpb/kv.proto, authpb/auth.proto and the LICENSE, keeping their import paths,
and strips what only etcd's Go build needs (gogoproto options and the grpc-gateway HTTP annotations),
which leaves the messages and services, and so the wire format, unchanged. scripts/gen_protos.py then
generates the Python stubs with the project's own.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = {"etcdserver/etcdserverpb/rpc.proto": "etcd/etcdserver/etcdserverpb/rpc.proto",
         "mvcc/mvccpb/kv.proto": "etcd/mvcc/mvccpb/kv.proto",
         "auth/authpb/auth.proto": "etcd/auth/authpb/auth.proto"}
_STRIP = [re.compile(r'^import "gogoproto/gogo\.proto";\n', re.M),
          re.compile(r'^import "google/api/annotations\.proto";\n', re.M),
          re.compile(r'^option \(gogoproto\.[a-z_]+\) = [a-z]+;\n', re.M),
          re.compile(r'\s*\[\(gogoproto\.[^\]]*\]')]
_HTTP_OPTION = re.compile(r'\n\s*option \(google\.api\.http\) = \{')


def strip(text: str) -> str:
    for pattern in _STRIP:
        text = pattern.sub("", text)
    while (match := _HTTP_OPTION.search(text)) is not None:  # a block with nested braces, up to its "};"
        depth, at = 1, match.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[at], 0)
            at += 1
        text = text[:match.start()] + text[at + 1:]  # + 1: the ";" after the closing brace
    return text


def main(checkout: str, tag: str) -> int:
    out = ROOT / "protos"
    for source, target in FILES.items():
        text = subprocess.run(["git", "-C", checkout, "show", f"{tag}:{source}"], check=True, capture_output=True,
                              text=True).stdout
        header = (f"// Vendored from etcd {tag} ({source}), Apache License 2.0 (protos/etcd/LICENSE), by\n"
                  f"// scripts/vendor_etcd_protos.py: gogoproto options and grpc-gateway annotations removed.\n")
        path = out / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + strip(text))
    license_text = subprocess.run(["git", "-C", checkout, "show", f"{tag}:LICENSE"], check=True, capture_output=True,
                                  text=True).stdout
    (out / "etcd" / "LICENSE").write_text(license_text)
    print(f"vendored {len(FILES)} etcd protos from {tag} into protos/etcd/")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
