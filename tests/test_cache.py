"""The on-disk graph cache (predictor.cache): keys that change with everything
a graph depends on, atomic writes, unreadable files treated as misses."""

from __future__ import annotations

import numpy as np
import pytest

from predictor import cache
from predictor.kernels import layout as L
from predictor.optable import Graph, OpTable


def toy_graph(name: str = "toy", batch: int = 4) -> Graph:
    n = 2
    d = np.zeros((n, L.MAX_DIMS), np.int64)
    d[0, :4] = [1, 64, 32, 16]
    d[1, :5] = [100, 50, 0, 50, 1]
    s = np.zeros_like(d)
    s[0, 1] = 8
    ops = OpTable(np.array([L.MATMUL, L.ELEMENTWISE]), np.array([L.FORWARD, L.BACKWARD]),
                  np.zeros(n, np.int64), np.array([3, 1]), np.array([1, 2]), d, s,
                  np.array([0, 1]), ["mm", "add"])
    return Graph(name, ops, batch_size=batch, mode="train", optimizer=None, seq_len=7,
                 host_ops=[5, 3, 0])


KW = dict(batch_size=4, seq_len=7, mode="train", optimizer=None)


def test_round_trip_through_the_cache(tmp_path):
    g = toy_graph()
    calls = []

    def trace():
        calls.append(1)
        return g

    a, hit_a = cache.cached_trace({"m": 1}, trace, name="toy", directory=tmp_path, **KW)
    b, hit_b = cache.cached_trace({"m": 1}, trace, name="toy", directory=tmp_path, **KW)
    assert (hit_a, hit_b) == (False, True) and len(calls) == 1
    assert b.host_ops == [5, 3, 0] and b.seq_len == 7 and b.batch_size == 4
    for f in ("family", "phase", "count", "kernels", "dbase", "dslope", "op"):
        np.testing.assert_array_equal(getattr(b.ops, f), getattr(g.ops, f))
    assert b.ops.op_names == ["mm", "add"]
    # Written atomically: no temp file is left beside the graph.
    assert [p.suffix for p in tmp_path.iterdir()] == [".npz"]


def test_refresh_traces_again(tmp_path):
    calls = []
    trace = lambda: calls.append(1) or toy_graph()  # noqa: E731
    cache.cached_trace("m", trace, name="toy", directory=tmp_path, **KW)
    _, hit = cache.cached_trace("m", trace, name="toy", directory=tmp_path, refresh=True, **KW)
    assert not hit and len(calls) == 2


@pytest.mark.parametrize("change", [
    {"identity": {"m": 2}}, {"batch_size": 8}, {"seq_len": 8}, {"mode": "inference"},
    {"optimizer": "adam"}, {"extra": "protocol-2"},
])
def test_key_changes_with_every_input(change):
    base = dict(identity={"m": 1}, extra=None, **KW)
    k0 = cache.graph_key(base.pop("identity"), **base)
    args = dict(identity={"m": 1}, extra=None, **KW)
    args.update(change)
    assert cache.graph_key(args.pop("identity"), **args) != k0


def test_key_changes_with_the_source_and_versions(monkeypatch):
    k0 = cache.graph_key("m", **KW)
    env = cache.environment()
    monkeypatch.setattr(cache, "environment", lambda: {**env, "sources": "other"})
    k1 = cache.graph_key("m", **KW)
    monkeypatch.setattr(cache, "environment",
                        lambda: {**env, "libraries": {**env["libraries"], "torch": "0.0"}})
    k2 = cache.graph_key("m", **KW)
    assert len({k0, k1, k2}) == 3


def test_source_hash_covers_the_tracing_modules():
    assert "predictor.lowering" in cache.GRAPH_SOURCES
    assert "predictor.families" in cache.GRAPH_SOURCES
    assert "predictor.frontend.fx" in cache.GRAPH_SOURCES
    h = cache.source_hash()
    assert len(h) == 64 and h != cache.source_hash(("predictor.lowering",))
    # Every frontend module a trace runs decides what the cached graph holds
    # (the memory pass's profile, autocast's dtypes, ...): a change to any of
    # them must miss the cache.
    import subprocess
    import sys

    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, predictor.frontend.fx, predictor.frontend.blocks; "
         "print('\\n'.join(m for m in sys.modules if m.startswith('predictor.frontend.')))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert loaded and not set(loaded) - set(cache.GRAPH_SOURCES)


def test_unreadable_file_is_a_miss(tmp_path):
    key = cache.graph_key("m", **KW)
    cache.store(key, toy_graph(), "toy", tmp_path)
    (path,) = tmp_path.iterdir()
    path.write_bytes(b"not a zip file")
    assert cache.load(key, "toy", tmp_path) is None
    g, hit = cache.cached_trace("m", toy_graph, name="toy", directory=tmp_path, **KW)
    assert not hit and g.name == "toy"
    assert cache.load(key, "toy", tmp_path) is not None


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"
    monkeypatch.delenv(cache.ENV_DIR)
    assert cache.cache_dir().parts[-2:] == ("dnn-predictor", "graphs")


def test_default_directory_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path))
    cache.cached_trace("m", toy_graph, name="toy/odd name", **KW)
    (path,) = tmp_path.iterdir()
    assert path.name.startswith("toy_odd_name-") and path.suffix == ".npz"


def test_zoo_identity_names_the_model():
    a, b = cache.zoo_identity("resnet50"), cache.zoo_identity("ResNet-50")
    assert a == b and a["zoo"] == "resnet50"
    assert cache.zoo_identity("gpt2") != a


# ---- hostile inputs (issue 19, F9) ----------------------------------------------

def test_cache_dir_honours_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv(cache.ENV_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "dnn-predictor" / "graphs"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # ignored, as the XDG spec says
    assert cache.cache_dir().parts[-3:] == (".cache", "dnn-predictor", "graphs")
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "c"))  # the predictor's own wins
    assert cache.cache_dir() == tmp_path / "c"


def test_cache_folder_is_private(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "c"))
    cache.cached_trace("m", toy_graph, name="toy", **KW)
    assert (tmp_path / "c").stat().st_mode & 0o777 == 0o700


def test_an_entry_of_another_key_is_never_used(tmp_path):
    """A valid graph of another model under a key (resnet50 came back as
    dcgan): the key is stored in the entry and checked."""
    key = cache.graph_key("resnet50", **KW)
    other = cache.graph_key("dcgan", **KW)
    cache.store(other, toy_graph("dcgan"), "toy", tmp_path)
    (planted,) = tmp_path.iterdir()
    planted.rename(cache._file(key, "toy", tmp_path))
    with pytest.warns(RuntimeWarning, match="another key"):
        assert cache.load(key, "toy", tmp_path) is None
    g, hit = cache.cached_trace("resnet50", lambda: toy_graph("resnet50"), name="toy",
                                directory=tmp_path, **KW)
    assert not hit and g.name == "resnet50"
    g, hit = cache.cached_trace("resnet50", lambda: toy_graph("wrong"), name="toy",
                                directory=tmp_path, **KW)
    assert hit and g.name == "resnet50"


def test_an_entry_without_a_key_is_a_miss(tmp_path):
    key = cache.graph_key("m", **KW)
    toy_graph().save(cache._file(key, "toy", tmp_path))  # a plain saved graph: no key
    with pytest.warns(RuntimeWarning, match="no key"):
        assert cache.load(key, "toy", tmp_path) is None
