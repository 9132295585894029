"""[clustering] node_name: a node's name in the cluster, kept in its data directory
(cluster/node.py's node_id_of). A real cluster of named nodes is checked in
test_failover.py (test_every_node_reports_the_cluster)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from warren.cluster.node import node_id_of
from warren.config import Config, ConfigError


def test_unset_the_id_is_random_hex_kept_in_the_data_directory(tmp_path: Path) -> None:
    first = node_id_of(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{12}", first)
    assert node_id_of(tmp_path) == first
    assert (tmp_path / ".node_id").read_text() == first + "\n"


def test_a_name_is_the_id_and_stays_when_unset_again(tmp_path: Path) -> None:
    assert node_id_of(tmp_path, "node1") == "node1"
    assert node_id_of(tmp_path) == "node1"  # the name is kept, as the hex id was


def test_renaming_a_node_says_it_joins_as_a_new_member(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = node_id_of(tmp_path)
    with caplog.at_level(logging.WARNING, logger="warren.cluster"):
        assert node_id_of(tmp_path, "node2") == "node2"
    assert f"this node was {old} and is now named node2" in caplog.text
    assert node_id_of(tmp_path) == "node2"


@pytest.mark.parametrize("name", ["node 1", "a,b", "-x", "n" * 65, "nöde"])
def test_a_name_that_would_not_fit_the_isr_list_is_refused(tmp_path: Path, name: str) -> None:
    ini = tmp_path / "warren.ini"
    ini.write_text(f"[clustering]\nnode_name = {name}\n")
    with pytest.raises(ConfigError, match=r"\[clustering\] node_name"):
        Config.from_ini(ini)


def test_a_good_name_is_read(tmp_path: Path) -> None:
    ini = tmp_path / "warren.ini"
    ini.write_text("[clustering]\nnode_name = rabbit-1.eu_west\n")
    assert Config.from_ini(ini).clustering_node_name == "rabbit-1.eu_west"
