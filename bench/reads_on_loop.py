"""A prototype of the CommitLog's grpc.aio port with reads answered on the loop, for bench/concurrency.py.

``python bench/reads_on_loop.py <the commit log's flags>`` runs the service's own main (commitlog_service.main),
its grpc.aio servicer (LoopCommitLogServicer: ``--append-on-loop true``) given two more ``async def`` handlers:
Pull and GetStoreInfo, calling the same code, so that mqstore_rpc.aio runs them on the event loop (with the
interceptors' async variants) instead of handing them to the pool and back through its shim. Pull has no
long poll in the benchmark, so it never waits on the loop. What it measures: grpc.aio's own cost for a read,
apart from the loop -> pool -> loop hop the port pays today.

The one bench file that imports a service package (tests/test_layering.py allows this file only): it is a
server process patched to try a design not built yet, as bench/sync_on_loop.py is one built from core.
"""

from __future__ import annotations

import sys

from commitlog_service import main as service_main
from commitlog_service.servicer import CommitLogServicer, LoopCommitLogServicer


class ReadsOnLoop(LoopCommitLogServicer):
    async def Pull(self, request, context):
        return CommitLogServicer.Pull(self, request, context)
    Pull.wire_parse = CommitLogServicer.Pull.wire_parse

    async def GetStoreInfo(self, request, context):
        return CommitLogServicer.GetStoreInfo(self, request, context)


def main(argv: list[str] | None = None) -> int:
    service_main.LoopCommitLogServicer = ReadsOnLoop  # serving() picks the aio port's servicer by this name
    return service_main.main(argv)


if __name__ == "__main__":
    sys.exit(main())
