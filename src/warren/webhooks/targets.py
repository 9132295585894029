"""Webhook targets: where broker events are POSTed, which ones, how hard to try.

Read from the JSON file ``[main] webhooks_file`` names (docs/webhooks.md): a
list of targets, or ``{"targets": [...]}``; the management API's targets
(``PUT /api/webhooks/<name>``, the definitions' ``webhooks``) have the same
keys. Every mistake is a ConfigError that names the target and the key, so a
typo stops the start rather than leaving a receiver silently unfed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from warren.config import ConfigError

__all__ = [
    "WebhookTarget",
    "load_targets",
    "parse_target",
    "parse_targets",
    "target_document",
]


@dataclass(frozen=True)
class WebhookTarget:
    """One receiver of events (the keys of a target in the webhooks file)."""

    name: str
    url: str
    #: Globs on event names (``queue.*``, ``connection.created``); any may match.
    events: tuple[str, ...] = ("*",)
    #: Globs on vhost names; an event that has no vhost (alarm.*, user.*) passes.
    vhosts: tuple[str, ...] = ("*",)
    #: HMAC-SHA256 key of the X-Warren-Signature header; None: unsigned.
    secret: str | None = None
    #: ms one POST may take (on the broker's clock) before it counts as failed.
    timeout_ms: int = 5000
    #: Further attempts after a failed one; then the event is given up (counted).
    max_retries: int = 5
    #: ms before the first retry, doubled for each further one, up to backoff_max_ms.
    backoff_ms: int = 1000
    backoff_max_ms: int = 60000
    #: Events held for it at most; when full the oldest is dropped (counted).
    buffer: int = 1000

    def wants(self, event: str, vhost: str | None) -> bool:
        """Whether this target's filters let ``event`` (about ``vhost``) through."""
        if not any(fnmatchcase(event, glob) for glob in self.events):
            return False
        return vhost is None or any(fnmatchcase(vhost, glob) for glob in self.vhosts)

    def backoff(self, attempt: int) -> int:
        """ms to wait before retry number ``attempt`` (1 for the first)."""
        return int(min(self.backoff_ms * 2 ** (attempt - 1), self.backoff_max_ms))


_INTS = {
    "timeout_ms": 1,
    "max_retries": 0,
    "backoff_ms": 0,
    "backoff_max_ms": 0,
    "buffer": 1,
}
_KEYS = {"name", "url", "events", "vhosts", "secret", *_INTS}


def _globs(where: str, key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {key} must be a name glob or a non-empty list of them")
    return tuple(value)


def _target(where: str, raw: Any, index: int) -> WebhookTarget:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: target {index} must be an object")
    name = raw.get("name", f"webhook-{index}")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: target {index}: name must be a non-empty string")
    where = f"{where}: target '{name}'"
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})"
        )
    url = raw.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
        raise ConfigError(f"{where}: url must be an http:// or https:// URL")
    secret = raw.get("secret")
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise ConfigError(f"{where}: secret must be a non-empty string")
    ints: dict[str, int] = {}
    for key, least in _INTS.items():
        if key in raw:
            value = raw[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{where}: {key} must be an integer >= {least}")
            ints[key] = value
    return WebhookTarget(
        name=name,
        url=url,
        events=_globs(where, "events", raw.get("events", "*")),
        vhosts=_globs(where, "vhosts", raw.get("vhosts", "*")),
        secret=secret,
        **ints,
    )


def parse_target(raw: Any, name: str, where: str = "webhook") -> WebhookTarget:
    """The target ``name`` of a document without its name (PUT /api/webhooks/<name>)."""
    if isinstance(raw, dict):
        if raw.get("name", name) != name:
            raise ConfigError(f"{where}: target '{name}': the name differs from the path's")
        raw = {**raw, "name": name}
    return _target(where, raw, 0)


def target_document(target: WebhookTarget) -> dict[str, Any]:
    """``target`` as the webhooks file writes it (what parse_targets reads back):
    only the keys that differ from the defaults."""
    default = WebhookTarget(target.name, target.url)
    doc: dict[str, Any] = {"name": target.name, "url": target.url}
    for key in ("events", "vhosts", "secret", *_INTS):
        value = getattr(target, key)
        if value != getattr(default, key):
            doc[key] = list(value) if isinstance(value, tuple) else value
    return doc


def parse_targets(data: Any, where: str = "webhooks") -> list[WebhookTarget]:
    """The targets of a webhooks document (a list, or ``{"targets": [...]}``)."""
    if isinstance(data, dict) and set(data) == {"targets"}:
        data = data["targets"]
    if not isinstance(data, list):
        raise ConfigError(f'{where}: expected a list of targets or {{"targets": [...]}}')
    targets = [_target(where, raw, i) for i, raw in enumerate(data)]
    names = [t.name for t in targets]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{where}: two targets are named '{name}'")
    return targets


def load_targets(path: str | Path) -> list[WebhookTarget]:
    """The targets of the webhooks file at ``path`` (ConfigError if unreadable)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read webhooks file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON: {exc}") from None
    return parse_targets(data, str(path))
