"""A real etcd (Debian's etcd-server) on free ports in a temporary directory."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

from free_ports import free_port

ETCD = shutil.which("etcd")


class EtcdProcess:
    """One etcd member; ``url`` is its client endpoint."""

    def __init__(
        self, data_dir: Path, host: str = "127.0.0.1", tls: tuple[Path, Path, Path] | None = None
    ) -> None:
        """``tls``: (certificate, key, CA bundle): clients reach it over https and
        must present a certificate that CA signed (etcd's --client-cert-auth)."""
        assert ETCD is not None
        self.client_port = free_port()
        self.peer_port = free_port()
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://{host}:{self.client_port}"
        extra: list[str] = []
        if tls is not None:
            cert, key, ca = tls
            extra = ["--cert-file", str(cert), "--key-file", str(key), "--client-cert-auth",
                     "--trusted-ca-file", str(ca)]  # fmt: skip
        self.proc = subprocess.Popen(
            [
                ETCD,
                "--name",
                "test",
                "--data-dir",
                str(data_dir),
                "--listen-client-urls",
                self.url,
                "--advertise-client-urls",
                self.url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{self.peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{self.peer_port}",
                "--initial-cluster",
                f"test=http://127.0.0.1:{self.peer_port}",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        self.log: list[str] = []
        for line in self.proc.stderr:
            self.log.append(line)
            if "ready to serve client requests" in line:
                break
        else:
            raise RuntimeError("etcd exited before serving:\n" + "".join(self.log[-20:]))
        # Keep draining its log so etcd never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
