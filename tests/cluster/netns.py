"""A private network of hosts on this machine, for partition tests: one Linux
network namespace per cluster node, each joined by a veth pair to a bridge in
the test's own namespace (which holds etcd and the clients).

    host side            node side (namespace wn<tag>-<i>)
    bridge wb<tag>  ---  veth wv<tag>h<i> === wv<tag>n<i>  10.A.B.(10+i)
    10.A.B.1

Taking a node's host-side link down cuts it off from everyone (etcd, the
other nodes, the clients) while it keeps running, as a pulled cable or a
network partition would; bringing it up heals the partition. Needs root
(CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2; ``available()`` says whether this
machine allows it.
"""

from __future__ import annotations

import ipaddress
import random
import secrets
import shutil
import subprocess

IP = shutil.which("ip")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert IP is not None
    return subprocess.run([IP, *args], capture_output=True, text=True, check=check, timeout=30)


def available() -> str | None:
    """None when namespaces can be made here; otherwise why not."""
    if IP is None:
        return "iproute2's ip is not installed"
    name = "wnprobe" + secrets.token_hex(3)
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"cannot make network namespaces: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that no route of this machine covers (two test runs at once
    each pick their own)."""
    routes = _ip("-4", "route", "show", "table", "all").stdout
    taken = []
    for line in routes.splitlines():
        first = line.split()[0] if line.split() else ""
        try:
            taken.append(ipaddress.ip_network(first, strict=False))
        except ValueError:
            continue
    while True:
        net = ipaddress.ip_network(f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return net


class Network:
    """The bridge and ``hosts`` namespaces; ``close()`` removes them all."""

    def __init__(self, hosts: int) -> None:
        self.tag = secrets.token_hex(2)
        subnet = _free_subnet()
        base = subnet.network_address
        self.gateway = str(base + 1)
        self.bridge = f"wb{self.tag}"
        self.namespaces = [f"wn{self.tag}-{i}" for i in range(hosts)]
        self.addresses = [str(base + 10 + i) for i in range(hosts)]
        self._host_links = [f"wv{self.tag}h{i}" for i in range(hosts)]
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, ns in enumerate(self.namespaces):
                host_link, node_link = self._host_links[i], f"wv{self.tag}n{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", host_link, "type", "veth", "peer", "name", node_link)
                _ip("link", "set", host_link, "master", self.bridge)
                _ip("link", "set", host_link, "up")
                _ip("link", "set", node_link, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", node_link)
                _ip("-n", ns, "link", "set", node_link, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def cut(self, host: int) -> None:
        """Partition ``host`` from everyone: its link to the bridge goes down."""
        _ip("link", "set", self._host_links[host], "down")

    def heal(self, host: int) -> None:
        _ip("link", "set", self._host_links[host], "up")

    def close(self) -> None:
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)  # takes its veth pair with it
        _ip("link", "del", self.bridge, check=False)
