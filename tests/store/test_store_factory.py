"""The data directory hands its disk budget and replication mirror to every
store and log the StoreFactory makes; nothing finds them by path any more.

Each kind of store writes through the factory into a real data directory,
and the mirror it was given (a recorder standing in for cluster/leader.py's
Replicator) must hear of the files under that store's directory, and the
budget must be charged for them. A second data directory with its own
mirror and budget, alive at the same time, hears of nothing of the first:
with a registry by path the nearest root would win, here each writer keeps
what it was given.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

from paths import REPO

from warren.config import Config
from warren.core.dedup import Deduplicator
from warren.core.message import Message
from warren.core.vhost import QUORUM, VHost
from warren.store.disk_budget import DiskBudget
from warren.store.layout import DataDir
from warren.store_factory import StoreFactory

SRC = REPO / "src" / "warren"


class Recorder:
    """A FileMirror that keeps the path of every report it hears."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def wants_data(self) -> bool:
        return True

    def appended(self, path: Path, offset: int, data: bytes) -> None:
        self.paths.append(path)

    def allocated(self, path: Path, size: int) -> None:
        self.paths.append(path)

    def renamed(self, path: Path, to: Path) -> None:
        self.paths.append(to)

    def replaced(self, path: Path, data: bytes) -> None:
        self.paths.append(path)

    def deleted(self, path: Path) -> None:
        self.paths.append(path)

    def heard_under(self, directory: Path) -> bool:
        return any(p == directory or directory in p.parents for p in self.paths)


def msg(i: int) -> Message:
    return Message("ex", "rk", b"\x10\x00\x02", b"m%d" % i, 1000 + i)


def data_dir(root: Path) -> tuple[DataDir, Recorder, DiskBudget]:
    budget = DiskBudget(on_spent=lambda: None)
    budget.left = 1 << 40
    recorder = Recorder()
    return DataDir(root, budget, recorder), recorder, budget


def test_every_store_and_log_is_given_the_directorys_mirror_and_budget(tmp_path: Path) -> None:
    data, recorder, budget = data_dir(tmp_path / "a")
    other, other_recorder, other_budget = data_dir(tmp_path / "a" / "vhosts" / "nested")
    factory = StoreFactory(data, Config(data_dir=str(data.root), segment_size=1 << 20))
    StoreFactory(other, Config(data_dir=str(other.root)))  # alive beside it
    vhost = VHost("/", lambda fn: None)
    stores = {
        "classic": factory.queue_store(vhost, "classic", True, 0),
        "priority": factory.queue_store(vhost, "prio", True, 5),
        "quorum": factory.queue_store(vhost, "qq", True, QUORUM),
    }
    for i, store in enumerate(stores.values()):
        store.append(msg(i))
        store.flush()
    delayed = factory.exchange_store(vhost, "dx", True)
    delayed.append(msg(9))
    delayed.flush()
    stream = factory.stream_store(vhost, "s", {})
    stream.append(msg(10))
    stream.flush()
    definitions = factory.definitions_log("/")
    definitions.put("q:classic", {"durable": True})
    owner = SimpleNamespace(vhost=vhost, vhost_name="/", name="classic")
    keys = factory.key_log(owner, Deduplicator(10))
    keys.recorded(("k", 1000.0, None), [])
    owner.name = "dx"
    exchange_keys = factory.exchange_key_log(owner, Deduplicator(10))
    exchange_keys.recorded(("k", 1000.0, None), [])
    for name in ("classic", "prio", "qq", "s"):
        assert recorder.heard_under(data.queue_dir("/", name)), name
    assert recorder.heard_under(data.exchange_dir("/", "dx"))
    assert data.definitions_file("/") in recorder.paths
    assert data.queue_dir("/", "classic") / "dedup.keys" in recorder.paths
    assert data.exchange_dir("/", "dx") / "dedup.keys" in recorder.paths
    assert budget.left < 1 << 40
    assert not other_recorder.paths and other_budget.left == 1 << 40
    for closing in (*stores.values(), delayed, stream, definitions):
        closing.close()


def test_transient_stores_are_metered_but_never_mirrored(tmp_path: Path) -> None:
    """The transient area is local to the node (cluster/leader.py's LOCAL_ONLY):
    its stores are given no mirror at all, but they fill the same disk."""
    data, recorder, budget = data_dir(tmp_path)
    factory = StoreFactory(data, Config(data_dir=str(data.root), segment_size=1 << 20))
    vhost = VHost("/", lambda fn: None)
    for name, priority in (("t", 0), ("tp", 3)):
        store = factory.queue_store(vhost, name, False, priority)
        store.append(msg(0))
        store.flush()
        store.delete()
    delayed = factory.exchange_store(vhost, "tx", False)
    delayed.append(msg(1))
    delayed.flush()
    delayed.close()
    assert not recorder.heard_under(data.transient_root)
    assert budget.left < 1 << 40


def test_a_mirror_set_after_a_store_was_made_does_not_reach_it(tmp_path: Path) -> None:
    """Stores take the mirror when they are made (the broker sets it before its
    start restores any): one made earlier keeps what it was given."""
    data, recorder, _budget = data_dir(tmp_path)
    data.mirror = None
    factory = StoreFactory(data, Config(data_dir=str(data.root), segment_size=1 << 20))
    vhost = VHost("/", lambda fn: None)
    before = factory.queue_store(vhost, "before", True, 0)
    data.mirror = recorder
    after = factory.queue_store(vhost, "after", True, 0)
    for store in (before, after):
        store.append(msg(0))
        store.flush()
        store.close()
    assert recorder.heard_under(data.queue_dir("/", "after"))
    assert not recorder.heard_under(data.queue_dir("/", "before"))


def _module_level_dicts(path: Path) -> list[str]:
    """Names bound at module level to a dict display or dict() (a registry)."""
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        is_dict = isinstance(value, ast.Dict) or (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in ("dict", "defaultdict", "WeakValueDictionary")
        )
        if is_dict:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [f"{path.relative_to(SRC)}: {ast.unparse(t)}" for t in targets]
    return found


#: Module-level dicts that are no registry: neither keyed by path nor holding
#: anything of a data directory.
NOT_REGISTRIES = {
    "store/records.py: _EXCHANGE_NAMES",  # exchange names decoded once (bytes -> str)
    "cluster/codec.py: _TYPES",  # frame class -> type number
}


def test_no_store_module_keeps_a_registry() -> None:
    """The mirror and budget were found through module-level dicts keyed by
    path (mirror_for, budget_for): no module of the store layer or of
    clustering keeps such a dict any more, and neither lookup exists."""
    modules = sorted((SRC / "store").glob("*.py")) + sorted((SRC / "cluster").glob("*.py"))
    modules.append(SRC / "store_factory.py")
    found = {name for path in modules for name in _module_level_dicts(path)}
    assert found - NOT_REGISTRIES == set()
    text = "\n".join(path.read_text(encoding="utf-8") for path in SRC.rglob("*.py"))
    for gone in ("mirror_for", "budget_for", "mirror.attach", "disk_budget.attach"):
        assert gone not in text, gone
