"""The management API's webhook targets, kept in ``<data_dir>/webhooks.json``.

The webhooks file (``[main] webhooks_file``) is the operator's and read-only;
targets made through the API (PUT /api/webhooks/<name>, a definitions import)
are written here whole at every change, atomically and checksummed as the
data directory's other JSON files (store/layout.py), so they come back at the
next start, on this node and, through the mirror, on a promoted follower.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from warren.config import ConfigError
from warren.core.errors import ResourceError
from warren.store import damage
from warren.store.layout import read_json_checked, write_json_atomically
from warren.store.mirror import FileMirror
from warren.webhooks.targets import WebhookTarget, parse_targets, target_document

__all__ = ["SAVED_FILE", "SavedTargets"]

log = logging.getLogger("warren.webhooks")

#: The file's name in the data directory.
SAVED_FILE = "webhooks.json"


class SavedTargets:
    """Where the API's targets are kept: ``load`` at start, ``save`` at each change."""

    def __init__(
        self,
        path: Path,
        mirror: Callable[[], FileMirror | None] = lambda: None,
        on_damage: str = damage.REFUSE,
    ) -> None:
        """``mirror``: the data directory's, once the broker has one."""
        self.path = path
        self._mirror = mirror
        self._on_damage = on_damage

    def load(self) -> list[WebhookTarget]:
        """The saved targets; none when there is no file. A damaged file refuses
        the start, or is set aside (store/damage.py: ``damaged_metadata``)."""
        try:
            data = read_json_checked(self.path, ("targets",))
            return parse_targets(data.get("targets", []), str(self.path))
        except FileNotFoundError:
            return []
        except (OSError, ValueError, ConfigError) as exc:
            damage.handle(self.path, f"unreadable ({exc}); no API webhooks", self._on_damage)
            return []

    def save(self, targets: list[WebhookTarget]) -> None:
        """Write ``targets`` (ResourceError when they cannot be: nothing changed)."""
        data = {"targets": [target_document(t) for t in targets]}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomically(self.path, data, self._mirror())
        except OSError as exc:
            log.error("cannot save %s: %s", self.path, exc)
            raise ResourceError(f"cannot store the webhooks: {exc.strerror or exc}") from None
