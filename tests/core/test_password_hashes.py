"""Password hashes: RabbitMQ's SHA-256 (default), SHA-512 and MD5, and bcrypt, as
definitions, the management API and users.json carry them; logins check each.

In memory (issue 29): tests/harness brokers, AMQP logins over MemoryAMQP
(harness.channel), the management API through ``harness.http()``; a restart is
a new Harness on the same data dir.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from harness import ConnectionClosed, Harness, harness_fixture

from warren.core.users import BCRYPT, MD5, SHA256, SHA512, check_password, hash_password
from warren.definitions_export import export_definitions
from warren.definitions_import import import_definitions

broker = harness_fixture()


def can_login(b: Harness, user: str, password: str) -> bool:
    """Whether ``user`` gets a connection with ``password`` (refused: 403 at
    connection.start-ok, pika's ProbableAuthenticationError)."""
    try:
        b.amqp_connection(user, password, "/").close()
    except ConnectionClosed as exc:
        assert exc.reply_code == 403, exc
        return False
    return True


def rabbit_hash(password: str, digest: Any, salt: bytes = b"\x01\x02\x03\x04") -> str:
    """RabbitMQ's scheme, computed independently: base64(salt + H(salt + password))."""
    return base64.b64encode(salt + digest(salt + password.encode()).digest()).decode()


@pytest.mark.parametrize(
    ("algorithm", "digest"),
    [(SHA256, hashlib.sha256), (SHA512, hashlib.sha512), (MD5, hashlib.md5)],
)
def test_rabbitmq_schemes(algorithm: str, digest: Any) -> None:
    h = rabbit_hash("s3cret", digest)
    assert check_password("s3cret", h, algorithm)
    assert not check_password("wrong", h, algorithm)
    assert hash_password("s3cret", b"\x01\x02\x03\x04", algorithm) == h


def test_bcrypt() -> None:
    h = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    assert check_password("s3cret", h, BCRYPT)
    assert not check_password("wrong", h, BCRYPT)
    assert not check_password("s3cret", "", SHA256)  # no password: no password login


def test_imported_hashes_log_in_and_survive_a_restart(tmp_path: Path) -> None:
    users = [
        ("u256", rabbit_hash("p256", hashlib.sha256), "rabbit_password_hashing_sha256"),
        ("u512", rabbit_hash("p512", hashlib.sha512), "rabbit_password_hashing_sha512"),
        ("umd5", rabbit_hash("pmd5", hashlib.md5), "rabbit_password_hashing_md5"),
        ("ubc", bcrypt.hashpw(b"pbc", bcrypt.gensalt(rounds=4)).decode(), "Bcrypt"),
    ]
    definitions = {
        "users": [
            {"name": n, "password_hash": h, "hashing_algorithm": a, "tags": []} for n, h, a in users
        ],
        "permissions": [
            {"user": n, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
            for n, _, _ in users
        ],
    }
    b = Harness(tmp_path / "data")
    try:
        b.call(lambda: (import_definitions(b.broker, definitions), b.broker.save_users()))
        for name, password in (
            ("u256", "p256"),
            ("u512", "p512"),
            ("umd5", "pmd5"),
            ("ubc", "pbc"),
        ):
            assert can_login(b, name, password), name
            assert not can_login(b, name, password + "x"), name
        exported = b.call(lambda: export_definitions(b.broker))
    finally:
        b.stop()
    algorithms = {u["name"]: u["hashing_algorithm"] for u in exported["users"]}
    assert algorithms["u512"] == SHA512 and algorithms["umd5"] == MD5
    assert algorithms["ubc"] == BCRYPT
    saved = json.loads((tmp_path / "data" / "users.json").read_text())
    assert {u["name"]: u["hashing_algorithm"] for u in saved["users"]}["u512"] == SHA512
    b = Harness(tmp_path / "data")
    try:
        assert can_login(b, "u512", "p512") and can_login(b, "ubc", "pbc")
    finally:
        b.stop()


def test_management_api_takes_a_sha512_hash(broker: Harness) -> None:
    api = broker.http()
    body = {
        "password_hash": rabbit_hash("api512", hashlib.sha512),
        "hashing_algorithm": "rabbit_password_hashing_sha512",
        "tags": "",
    }
    for path, payload in (
        ("/api/users/api-user", body),
        ("/api/permissions/%2F/api-user", {"configure": ".*", "write": ".*", "read": ".*"}),
    ):
        assert api.put(path, payload).status in (201, 204)
    assert can_login(broker, "api-user", "api512")
    assert api.get("/api/users/api-user")["hashing_algorithm"] == SHA512
