"""RabbitMQ's own management UI files, read where Debian's rabbitmq-server installs them.

RabbitMQ's web dispatcher serves the ``priv/www`` trees of every enabled
management plugin as one site: rabbitmq_management's (index.html, js/, css/)
plus each extension's (js/federation.js, js/shovel.js and their templates).
A plugin is a directory or a ``.ez`` (zip) archive of one; both are read in
place, so none of RabbitMQ's files is ever copied into this repository.
"""

from __future__ import annotations

import glob
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

PLUGINS_GLOB = "/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins"
#: The management plugin first: its index.html and js/ are the site.
UI_PLUGINS = ("rabbitmq_management", "rabbitmq_federation_management", "rabbitmq_shovel_management")


@dataclass
class WwwTree:
    """One plugin's priv/www: a directory, or the same path inside its .ez archive."""

    plugin: str
    directory: Path | None = None
    archive: zipfile.ZipFile | None = None
    prefix: str = ""

    def read(self, rel: str) -> bytes | None:
        parts = PurePosixPath(rel).parts
        if not parts or ".." in parts or rel.startswith("/"):
            return None
        if self.directory is not None:
            path = self.directory.joinpath(*parts)
            return path.read_bytes() if path.is_file() else None
        assert self.archive is not None
        try:
            return self.archive.read(self.prefix + "/".join(parts))
        except KeyError:
            return None


@dataclass
class RabbitMQWww:
    """The UI site: the first tree holding a path answers it."""

    version: str
    trees: list[WwwTree] = field(default_factory=list)

    def read(self, rel: str) -> bytes | None:
        for tree in self.trees:
            data = tree.read(rel)
            if data is not None:
                return data
        return None


def _tree(plugins: Path, name: str) -> WwwTree | None:
    for entry in sorted(plugins.glob(f"{name}-*")):
        if not re.fullmatch(rf"{name}-[0-9][^/]*", entry.name):
            continue
        if entry.is_dir() and (entry / "priv" / "www").is_dir():
            return WwwTree(name, directory=entry / "priv" / "www")
        if entry.suffix == ".ez" and zipfile.is_zipfile(entry):
            archive = zipfile.ZipFile(entry)
            for member in archive.namelist():
                head, sep, _ = member.partition("/priv/www/")
                if sep and "/" not in head:
                    return WwwTree(name, archive=archive, prefix=f"{head}/priv/www/")
            archive.close()
    return None


def find(plugins_glob: str = PLUGINS_GLOB) -> RabbitMQWww | None:
    """The newest installed RabbitMQ's UI, or None when there is none."""
    for plugins in sorted(glob.glob(plugins_glob), reverse=True):
        trees = [t for t in (_tree(Path(plugins), name) for name in UI_PLUGINS) if t is not None]
        if trees and trees[0].plugin == UI_PLUGINS[0] and trees[0].read("index.html"):
            version = Path(plugins).parent.name.removeprefix("rabbitmq_server-")
            return RabbitMQWww(version, trees)
    return None
