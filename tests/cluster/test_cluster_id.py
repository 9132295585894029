"""The cluster's permanent id (store/cluster_id.py): RabbitMQ's format, made once,
kept across restarts and moves of the data directory, the same in
rabbitmq_identity_info, /api/global-parameters and the definitions export.
(A three-node cluster's nodes report one id: tests/cluster/test_cluster_id.py.)"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import BrokerThread, refused_start
from httphelp import Api  # noqa: E402
from metricshelp import scrape
from paths import HTTP_DATA

Factory = Callable[..., BrokerThread]

RECORDED = json.loads(
    (HTTP_DATA / "rabbitmq_gap_answers.json").read_text(encoding="utf-8")
)


def _shape(cluster_id: str) -> str:
    """The id with its random part's characters (base64url) replaced by x."""
    prefix = "rabbitmq-cluster-id-"
    if not cluster_id.startswith(prefix):
        return cluster_id
    return prefix + re.sub(r"[A-Za-z0-9_-]", "x", cluster_id[len(prefix) :])


def _identity(b: BrokerThread) -> str:
    [(labels, _)] = scrape(b)["rabbitmq_identity_info"]
    return labels["rabbitmq_cluster_permanent_id"]


def test_the_id_has_rabbitmqs_format_and_outlives_restarts_and_moves(
    tmp_path: Path, broker_factory: Factory
) -> None:
    b = broker_factory(data_dir=tmp_path / "one")
    first = _identity(b)
    # RabbitMQ 3.10.8's, recorded: rabbitmq-cluster-id- and 22 base64url characters.
    assert _shape(first) == _shape(RECORDED["cluster_id"]["internal_cluster_id"])
    api = Api(b.http_port)
    assert api.get("/api/global-parameters/internal_cluster_id") == {
        "name": "internal_cluster_id",
        "value": first,
    }
    exported = api.get("/api/definitions")["global_parameters"]
    assert {"name": "internal_cluster_id", "value": first} in exported
    b.stop()
    b = broker_factory(data_dir=tmp_path / "one")
    assert _identity(b) == first
    b.stop()
    shutil.copytree(tmp_path / "one", tmp_path / "moved", ignore=shutil.ignore_patterns(".lock"))
    assert _identity(broker_factory(data_dir=tmp_path / "moved")) == first
    assert _identity(broker_factory(data_dir=tmp_path / "other")) != first


def test_the_id_cannot_be_changed_or_imported(broker: BrokerThread) -> None:
    api = Api(broker.http_port)
    mine = api.get("/api/global-parameters/internal_cluster_id")["value"]
    reply = api.request("PUT", "/api/global-parameters/internal_cluster_id", {"value": "x"})
    assert reply.status == 400
    assert "permanent id" in reply.json()["reason"]
    assert api.request("DELETE", "/api/global-parameters/internal_cluster_id").status == 400
    # A definitions file from another cluster (RabbitMQ's exports carry its id).
    other = {"global_parameters": [{"name": "internal_cluster_id",
                                    "value": "rabbitmq-cluster-id-AAAAAAAAAAAAAAAAAAAAAA"}]}
    assert api.request("POST", "/api/definitions", other).status == 204
    assert api.get("/api/global-parameters/internal_cluster_id")["value"] == mine
    assert _identity(broker) == mine


def test_a_damaged_id_file_refuses_the_start_or_is_set_aside(
    tmp_path: Path, broker_factory: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    b = broker_factory(data_dir=data)
    old = _identity(b)
    b.stop()
    (data / "cluster_id.json").write_text('{"internal_cluster_id": 1}')
    refusal = refused_start(data)
    assert "cluster_id.json" in str(refusal) and "not an id" in str(refusal)
    with caplog.at_level(logging.ERROR, logger="warren.store"):
        b = broker_factory(data_dir=data, damaged_metadata="set-aside")
    new = _identity(b)
    assert new != old and new.startswith("rabbitmq-cluster-id-")
    assert "a new cluster id is made" in caplog.text
    assert [p.name for p in data.glob("cluster_id.json.damaged-*")]
