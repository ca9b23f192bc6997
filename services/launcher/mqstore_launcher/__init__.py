"""The composition root above the services: the only package that may import more than one service
package (tests/test_layering.py). ``python -m mqstore_launcher`` is ``make run``.

  main.py         ``python -m mqstore_launcher``: its options; the launcher below, or its HA mode
  launcher.py     every service on loopback as child processes (the table of services, ``make run``)
  ha.py           the HA mode: three commit log nodes through a local 3-member etcd cluster, then the others
                  (``make run-ha``)
  child.py        a child process: its ports checked before start, ready when it logged and serves health
  etcd_local.py   a throwaway etcd server, or a cluster of several (the HA mode, tests and bench/replication.py)
"""
