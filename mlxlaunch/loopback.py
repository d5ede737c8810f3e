"""Whether a host name or address is this machine's loopback interface.

Shared by the server's exposure check (server/guards.py: loopback needs no --allow-remote) and
the cluster's host list (cluster/hosts.py: every loopback spelling is the one mlx.launch runs
without ssh), so the two agree on what "this machine's loopback" is.
"""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or address, no port) is this machine's loopback."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
