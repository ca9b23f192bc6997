"""The ``mqstore`` command line (console script ``mqstore``, or ``python -m mqstore_cli``): a client of the
services over their gRPC stubs (mqstore_rpc.gen), and the offline commands on a data directory. It imports
no service package (tests/test_layering.py).

  main.py         the commands on the commit log (topics, send, pull, get, offsets, store facts) and ``main``
  args.py         the argument parser, TLS and credentials of every channel
  errors.py       the error line (``error: <STATUS>: <message>``; UNIMPLEMENTED names what the server serves)
  index.py, txn.py, pop.py, compactor.py, replication.py, access.py   each service's commands
  offline.py      ``mqstore check``: the full check of a stopped store's commit log (runs locally, no gRPC)
  top.py          ``mqstore top``: the services' metrics endpoints, live
"""
