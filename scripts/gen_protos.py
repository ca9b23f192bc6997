"""Generate the Python gRPC stubs from protos/ into services/common/mqstore_rpc/gen/.

protoc writes imports such as ``from mqstore.v1 import common_pb2``; ``mqstore`` is our core package,
so the generated imports are rewritten to ``mqstore_rpc.gen.mqstore.v1``. etcd's v3 API protos (vendored
under protos/etcd/ by scripts/vendor_etcd_protos.py, for the replication controller's etcd client) get
the same treatment: ``from etcd.mvcc.mvccpb import kv_pb2`` -> ``mqstore_rpc.gen.etcd.mvcc.mvccpb``.
Run: ``python scripts/gen_protos.py``.
"""

from __future__ import annotations

import pathlib
import re
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
OUT_DIR = ROOT / "services" / "common" / "mqstore_rpc" / "gen"
_IMPORT = re.compile(r"^from (mqstore\.v1|etcd\.[a-z.]+) import", re.MULTILINE)


def main() -> int:
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={OUT_DIR}",
            f"--pyi_out={OUT_DIR}", f"--grpc_python_out={OUT_DIR}", *protos]
    if protoc.main(args) != 0:
        print("protoc failed", file=sys.stderr)
        return 1
    leaves = {OUT_DIR / pathlib.Path(proto).parent for proto in protos}
    for pkg in sorted(leaves | {p for leaf in leaves for p in leaf.parents if OUT_DIR in p.parents}) + [OUT_DIR]:
        (pkg / "__init__.py").touch()
    for generated in [*(OUT_DIR / "mqstore").rglob("*.py*"), *(OUT_DIR / "etcd").rglob("*.py*")]:
        text = generated.read_text()
        fixed = _IMPORT.sub(r"from mqstore_rpc.gen.\1 import", text)
        if fixed != text:
            generated.write_text(fixed)
    print(f"generated {len(protos)} protos into {OUT_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
