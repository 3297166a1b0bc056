"""One seed scheme: every stream named by purpose; old streams give the numbers they always gave."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline import seeds


@pytest.mark.parametrize("seed", [0, 3, 12345])
def test_legacy_streams_are_the_derivations_every_table_was_drawn_with(seed):
    assert seeds.seed_of("pretrain.init", seed) == seed
    assert seeds.seed_of("pretrain.draws", seed) == seed + 1
    assert seeds.seed_of("pretrain.batches", seed, 4) == seed * 1_000_003 + 4
    assert seeds.seed_of("dpdm.init", seed) == seed
    assert seeds.seed_of("dpdm.draws", seed) == seed + 1
    assert seeds.seed_of("dpdm.mechanism_noise", seed) == seed + 2
    assert seeds.seed_of("dpdm.sampling", seed) == seed
    want = torch.randn(5, generator=torch.Generator().manual_seed(seed + 2))
    assert torch.equal(torch.randn(5, generator=seeds.torch_generator("dpdm.mechanism_noise", seed)), want)
    # SENSGEO: default_rng([seed, salt]), one stream per output
    np.testing.assert_array_equal(seeds.numpy_rng("sensgeo.output", seed, 100).standard_normal(4),
                                  np.random.default_rng([seed, 100]).standard_normal(4))


def test_the_proxy_streams_are_its_seedsequence_keys():
    from pipeline.methods.empden_diagnostics import proxy as px

    for purpose, keys, old_keys in [("empden_proxy.start", (5, 7), (5, 7, 1)), ("empden_proxy.steps", (5, 7), (5, 7, 2)),
                                    ("empden_proxy.redraw", (5, 2, 1), (5, 3, 2, 1)),
                                    ("empden_proxy.subset", (5, 2), (5, 4, 2))]:
        assert seeds.seed_of(purpose, *keys) == px.generator(*old_keys).initial_seed()


def test_new_purposes_get_independent_reproducible_seedsequence_streams(monkeypatch):
    monkeypatch.setitem(seeds.STREAMS, "test.a", seeds.Stream("test.a", "a new stream"))
    monkeypatch.setitem(seeds.STREAMS, "test.b", seeds.Stream("test.b", "another"))
    a = seeds.seed_of("test.a", 7)
    assert a == seeds.seed_of("test.a", 7)  # reproducible
    assert a == seeds.mix([7, seeds.purpose_key("test.a")])  # SeedSequence keyed by purpose
    assert len({a, seeds.seed_of("test.b", 7), seeds.seed_of("test.a", 8), seeds.seed_of("test.a", 7, 1)}) == 4
    assert 0 <= a < 2 ** 63


def test_an_unknown_purpose_is_an_error_not_a_fresh_stream():
    with pytest.raises(KeyError, match="unknown random stream 'dpdm.mechanism_nosie'"):
        seeds.torch_generator("dpdm.mechanism_nosie", 0)


def test_every_stream_is_documented_and_keyed_by_its_own_name():
    everything = seeds.all_streams()
    assert set(seeds.STREAMS) < set(everything) and "dpdm.mechanism_noise" not in seeds.STREAMS
    for name, s in everything.items():
        assert s.purpose == name and s.doc and "." in name


#: a plug-in method's streams (tests below declare them through a stand-in of pipeline.plugins.methods)
PLUGIN = (seeds.Stream("plugin.draws", "a plug-in method's draws"),)
SAME_AGAIN = (PLUGIN[0],)
ANOTHER_MEANING = (seeds.Stream("plugin.draws", "another meaning", lambda seed: seed),)
HOUSE_RENAMED = (seeds.Stream("pretrain.init", "a method's own initialisation"),)


@pytest.fixture
def declared(monkeypatch):
    """Declare the given methods' streams (``"tests.test_seeds:<attribute>"``) in place of the real methods'."""
    from pipeline import plugins

    def declare(**streams: str) -> None:
        monkeypatch.setattr(plugins, "methods", lambda: {m: plugins.Method(m, streams=target)
                                                         for m, target in streams.items()})
        seeds.method_streams.cache_clear()

    yield declare
    seeds.method_streams.cache_clear()


def test_a_method_declares_its_own_streams_and_the_same_one_twice_is_fine(declared):
    declared(one=f"{__name__}:PLUGIN", two=f"{__name__}:SAME_AGAIN")
    assert seeds.seed_of("plugin.draws", 3) == seeds.mix([3, seeds.purpose_key("plugin.draws")])
    assert seeds.seed_of("pretrain.init", 3) == 3  # the house's streams first


@pytest.mark.parametrize("streams, by", [({"one": "PLUGIN", "two": "ANOTHER_MEANING"}, "by method 'one'"),
                                         ({"one": "HOUSE_RENAMED"}, "by the house")])
def test_a_purpose_declared_twice_differently_is_refused(declared, streams, by):
    declared(**{m: f"{__name__}:{attr}" for m, attr in streams.items()})
    with pytest.raises(ValueError, match=f"already declared differently {by}$"):
        seeds.stream("plugin.draws")
