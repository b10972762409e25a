"""Two hosts and a throwaway etcd on one machine, for the transport tests and bench/transfer.py.

Not part of the installed package: a serving process never needs it. Tests import it as
``tests.testbed`` (pytest puts the repository root on ``sys.path``, see pyproject.toml);
bench/transfer.py puts the root there itself. :mod:`.hosts` holds the network namespaces,
:mod:`.etcd` the etcd server and its throwaway PKI.
"""

from .hosts import (
    EtcdPKI,
    EtcdServer,
    Host,
    HostPair,
    enter_namespace,
    etcd_binary,
    free_port,
    make_pki,
    netns_unavailable,
)

__all__ = [
    "EtcdPKI",
    "EtcdServer",
    "Host",
    "HostPair",
    "enter_namespace",
    "etcd_binary",
    "free_port",
    "make_pki",
    "netns_unavailable",
]
