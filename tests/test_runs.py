"""The run-name grammar (pipeline.runs): one number encoding, one grammar per kind of run, and every
name read back to the run that wrote it; a name outside the grammar is refused in one line."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.baselines.runs import RUN_NAME as BASELINE_NAME
from pipeline.baselines.runs import BaselineRun, method_pattern
from pipeline.runs import (
    NUMBER_PATTERN, RunGrammar, RunNameError, choice, fmt_num, integer, number, parse_num, word)
from pipeline.methods.empden.grid import CELL_NAMES, CELL_PATTERN, Cell
from pipeline.stage import PipelineError
from pipeline.methods.dpdm.runs import RUN_NAME as DPDM_NAME
from pipeline.methods.dpdm.runs import DpdmRun
from pipeline.methods.straightdp.runs import RUN_NAME as STRAIGHTDP_NAME
from pipeline.methods.straightdp.runs import StraightRun

# --- numbers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("x", "token"), [
    (0.2, "0p2"), (10, "10"), (10.0, "10"), (1e-05, "1e-05"), (3.5, "3p5"), (0.002, "0p002"), (62.5, "62p5"),
    (0, "0"), (-1.5, "-1p5"), (-50, "-50"), (2.5e-3, "0p0025"), (1e6, "1000000"), (1e16, "1e+16"),
    (0.1 + 0.2, "0p30000000000000004"),
])
def test_a_number_is_written_without_a_dot_and_reads_back_exactly(x, token):
    assert fmt_num(x) == token and "." not in token
    assert re.fullmatch(NUMBER_PATTERN, token)
    assert parse_num(token) == float(x)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_round_trips_through_its_token(x):
    token = fmt_num(x)
    assert parse_num(token) == x and fmt_num(parse_num(token)) == token
    assert re.fullmatch(NUMBER_PATTERN, token) and "." not in token


@given(st.floats(min_value=1e-4, max_value=1e5).map(lambda x: float(f"{x:.6g}")))
def test_numbers_of_six_significant_digits_keep_their_percent_g_names(x):
    """Every name written before the shared grammar (``%g``, point as p) is written the same now."""
    assert fmt_num(x) == f"{x:g}".replace(".", "p")


@pytest.mark.parametrize("x", [float("nan"), float("inf"), -float("inf")])
def test_a_number_without_a_finite_value_has_no_token(x):
    with pytest.raises(RunNameError, match="only finite numbers"):
        fmt_num(x)


@pytest.mark.parametrize("token", ["0.2", "", "p2", "1e5", "1em05", "m1", "0p2p"])
def test_text_that_is_no_number_token_is_refused(token):
    with pytest.raises(RunNameError, match="is not a number as a run name writes it"):
        parse_num(token)


# --- a grammar ----------------------------------------------------------------------------------------

TOY = RunGrammar("toy run", (choice("kind", ("a", "ab")), number("eps", "eps"), integer("seed", "seed")),
                 example="a_eps1_seed0", head=word("tag", r"[a-z]+"), head_sep="-", head_optional=True)


def test_a_grammar_writes_key_value_tokens_joined_by_underscores_with_its_head_in_front():
    assert TOY.form == "[<tag>-]<kind>_eps<eps>_seed<seed>"
    assert TOY.write({"tag": "", "kind": "ab", "eps": 0.5, "seed": 3}) == "ab_eps0p5_seed3"
    assert TOY.write({"tag": "x", "kind": "a", "eps": -2, "seed": 0}) == "x-a_eps-2_seed0"
    assert TOY.read("x-ab_eps1e-05_seed12") == {"tag": "x", "kind": "ab", "eps": 1e-05, "seed": 12}
    assert TOY.read("a_eps1_seed0")["tag"] == ""


@pytest.mark.parametrize(("name", "why"), [
    ("b_eps1_seed0", "is not"), ("a_eps1", "is not"), ("a_eps0.5_seed0", "is not"), ("X-a_eps1_seed0", "is not"),
    ("a_eps1_seed0.npz", "is not"), ("a_eps0p50_seed0", "that run is 'a_eps0p5_seed0'"),
    ("a_eps1_seed01", "that run is 'a_eps1_seed1'"), ("a_eps1p0_seed0", "that run is 'a_eps1_seed0'"),
])
def test_a_name_outside_the_grammar_or_not_as_its_run_writes_it_is_refused_in_one_line(name, why):
    with pytest.raises(RunNameError, match=re.escape(why)) as err:
        TOY.read(name)
    message = str(err.value)
    assert "\n" not in message and repr(name) in message and TOY.form in message
    assert isinstance(err.value, ValueError) and isinstance(err.value, PipelineError)
    if why == "is not":  # the wildcard constraint refuses what the parser cannot read
        assert not re.fullmatch(TOY.pattern, name)


def test_a_value_the_grammar_cannot_read_back_is_refused_when_written():
    with pytest.raises(RunNameError, match="cannot be written"):
        TOY.write({"tag": "", "kind": "c", "eps": 1, "seed": 0})
    with pytest.raises(RunNameError, match="cannot be written"):
        TOY.write({"tag": "", "kind": "a", "eps": 1, "seed": -1})


def test_a_narrowed_grammar_accepts_only_the_chosen_words():
    only_ab = TOY.narrowed("kind", ("ab",))
    assert re.fullmatch(only_ab.pattern, "ab_eps1_seed0") and not re.fullmatch(only_ab.pattern, "a_eps1_seed0")
    with pytest.raises(ValueError, match="no field 'nope'"):
        TOY.narrowed("nope", ("x",))


def test_a_grammar_declaring_a_field_twice_is_refused():
    with pytest.raises(ValueError, match="declares a field twice"):
        RunGrammar("bad run", (integer("seed", "seed"), integer("seed", "s")), example="seed0_s0")


# --- every kind of run --------------------------------------------------------------------------------


@pytest.mark.parametrize(("grammar", "form"), [
    (DPDM_NAME, "<param>_eps<eps>_K<K>_seed<seed>"),
    (STRAIGHTDP_NAME, "[<arm>-]<row>_eps<eps>_seed<seed>"),
    (BASELINE_NAME, "<method>_eps<eps>_seed<seed>"),
    (CELL_NAMES["hybrid"], "<method>/p<p>_B<B>_T<T>_beta<beta>_s<seed>"),
    (CELL_NAMES["full_batch"], "<method>/smin<smin>_beta<beta>_s<seed>"),
    (CELL_NAMES["public_only"], "<method>/s<seed>"),
])
def test_each_kind_declares_its_fields_in_order(grammar, form):
    assert grammar.form == form
    assert re.fullmatch(grammar.pattern, grammar.example)
    assert grammar.write(grammar.read(grammar.example)) == grammar.example


EPS = st.one_of(st.sampled_from([0.1, 0.2, 0.3, 1.0, 3.5, 10.0, 1e-05, 2.5e-3, 0.1 + 0.2]),
                st.floats(min_value=1e-12, max_value=1e12))
SEEDS = st.integers(0, 10_000)


@given(param=st.sampled_from(("edm", "vpred", "vp", "ve")), eps=EPS, K=st.integers(1, 64), seed=SEEDS)
def test_a_dpdm_run_reads_back_from_its_name(param, eps, K, seed):
    run = DpdmRun(param, eps, K, seed)
    assert DpdmRun.from_name(run.name) == run and DpdmRun.from_name(run.name).name == run.name


@given(row=st.sampled_from(("uniform", "tha", "tha_moments", "lora_moments")), eps=EPS, seed=SEEDS,
       arm=st.sampled_from(("", "latent", "low_b0")))
def test_a_straightdp_run_reads_back_from_its_name(row, eps, seed, arm):
    run = StraightRun(row, eps, seed, arm)
    assert StraightRun.from_name(run.name) == run


@given(method=st.sampled_from(("dp_merf", "pe")), eps=EPS, seed=SEEDS)
def test_a_baseline_run_reads_back_from_its_name_and_only_its_method_rule_matches_it(method, eps, seed):
    run = BaselineRun(method, eps, seed)
    assert BaselineRun.from_name(run.name) == run
    assert re.fullmatch(method_pattern(method), run.name)
    assert not re.fullmatch(method_pattern({"pe": "dp_merf", "dp_merf": "pe"}[method]), run.name)


@given(method=st.sampled_from(("hybrid", "per_step")), p=st.floats(0.5, 100), B=st.integers(1, 5000),
       T=st.integers(0, 50), beta=st.floats(0.01, 10), seed=SEEDS)
def test_an_empden_cell_reads_back_from_its_name(method, p, B, T, beta, seed):
    cell = Cell(method, seed, beta, p, B, T)
    assert Cell.from_name(cell.name) == cell and re.fullmatch(CELL_PATTERN, cell.name)


@pytest.mark.parametrize(("run", "name"), [
    (DpdmRun("edm", 0.2, 4, 0), "edm_eps0p2_K4_seed0"),
    (DpdmRun("ve", 1e-5, 16, 7), "ve_eps1e-05_K16_seed7"),
    (StraightRun("tha_moments", 0.3, 1), "tha_moments_eps0p3_seed1"),
    (StraightRun("uniform", 0.3, 0, "latent"), "latent-uniform_eps0p3_seed0"),
    (BaselineRun("pe", 0.3, 0), "pe_eps0p3_seed0"),
    (Cell("hybrid", 0, 1.0, 65, 50, 3), "hybrid/p65_B50_T3_beta1_s0"),
    (Cell("full_batch", 0, 1.0, sigma_min=0.002), "full_batch/smin0p002_beta1_s0"),
    (Cell("public_only", 2), "public_only/s2"),
])
def test_the_names_the_pipeline_has_always_written_are_unchanged(run, name):
    assert run.name == name and type(run).from_name(name) == run


@pytest.mark.parametrize(("parse", "name", "message"), [
    (DpdmRun.from_name, "edm_eps0.2_K4_seed0", "DPDM run name 'edm_eps0.2_K4_seed0' is not <param>_eps<eps>_K<K>_seed"),
    (StraightRun.from_name, "Low-uniform_eps1_seed0", "STRAIGHTDP run name 'Low-uniform_eps1_seed0' is not [<arm>-]"),
    (BaselineRun.from_name, "gan_eps1_seed0", "baseline run name 'gan_eps1_seed0' is not <method>_eps<eps>_seed"),
    (Cell.from_name, "hybrid/p65_B50_s0", "EMPDEN cell name 'hybrid/p65_B50_s0' is not <method>/p<p>_B<B>"),
    (Cell.from_name, "gan/s0", "EMPDEN cell name 'gan/s0' is not <method>/<symbols>"),
])
def test_each_kind_refuses_a_malformed_name_in_one_line_naming_it_and_its_form(parse, name, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        parse(name)
    assert "\n" not in str(err.value)
