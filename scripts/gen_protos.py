"""Generate the Python gRPC stubs from protos/ into services/common/mqstore_rpc/gen/.

protoc writes imports such as ``from mqstore.v1 import common_pb2``; ``mqstore`` is our core package,
so the generated imports are rewritten to ``mqstore_rpc.gen.mqstore.v1``. The vendored RocketMQ 5 protocol
(protos/apache/rocketmq/v2, see protos/apache/README.md) is generated the same way into
``mqstore_rpc.gen.apache.rocketmq.v2``, and so are etcd's v3 API protos (vendored under protos/etcd/ by
scripts/vendor_etcd_protos.py, for the replication controller's etcd client): ``from etcd.mvcc.mvccpb
import kv_pb2`` -> ``mqstore_rpc.gen.etcd.mvcc.mvccpb``. Run: ``python scripts/gen_protos.py``.
"""

from __future__ import annotations

import pathlib
import re
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
OUT_DIR = ROOT / "services" / "common" / "mqstore_rpc" / "gen"
# protoc's import of a generated package -> where it lives under mqstore_rpc.gen
_IMPORTS = {package: re.compile(rf"^from {re.escape(package)} import", re.MULTILINE)
            for package in ("mqstore.v1", "apache.rocketmq.v2", "etcd.etcdserver.etcdserverpb", "etcd.mvcc.mvccpb",
                            "etcd.auth.authpb")}


def main() -> int:
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={OUT_DIR}",
            f"--pyi_out={OUT_DIR}", f"--grpc_python_out={OUT_DIR}", *protos]
    if protoc.main(args) != 0:
        print("protoc failed", file=sys.stderr)
        return 1
    for package in _IMPORTS:
        parts = package.split(".")
        for depth in range(len(parts) + 1):
            (OUT_DIR.joinpath(*parts[:depth]) / "__init__.py").touch()
    for package in _IMPORTS:  # a package may import another (etcd's rpc imports its kv and auth)
        for generated in OUT_DIR.joinpath(*package.split(".")).glob("*.py*"):
            text = fixed = generated.read_text()
            for imported, pattern in _IMPORTS.items():
                fixed = pattern.sub(f"from mqstore_rpc.gen.{imported} import", fixed)
            if fixed != text:
                generated.write_text(fixed)
    print(f"generated {len(protos)} protos into {OUT_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
