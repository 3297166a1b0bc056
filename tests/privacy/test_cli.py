"""``python -m pipeline account``: JSON answers, one-line errors."""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import sys
import warnings
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.privacy import accountants as acc
from pipeline.privacy import cli
from pipeline.privacy.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_subsampled_gaussian_reports_every_accountant(capsys):
    code, out, _ = run(capsys, "--mechanism", "subsampled-gaussian", "--mu", "1.0", "--sampling-prob", "0.01",
                       "--compositions", "200", "--delta", "1e-5", "--discretisation", "1e-3")
    assert code == 0
    result = json.loads(out)
    for key in ("eps_upper", "eps_lower", "eps_edgeworth", "edgeworth_valid", "eps_clt", "eps_rdp"):
        assert key in result
    assert result["eps_lower"] <= result["eps_upper"] <= result["eps_rdp"]
    assert "eps_upper" in result["bounds"] and "eps_edgeworth" in result["estimates"]
    assert result["eps_upper"] == pytest.approx(
        acc.pld_epsilon(acc.outputwise_event(1.0, 0.01, 200), 1e-5, settings=acc.PLDSettings(1e-3)))


def test_gaussian_reports_the_exact_gdp_eps(capsys):
    code, out, _ = run(capsys, "--mechanism", "gaussian", "--mu", "1.3", "--delta", "1e-5", "--discretisation", "1e-3")
    result = json.loads(out)
    assert code == 0
    assert result["eps_gdp"] == pytest.approx(acc.gdp_epsilon(1e-5, 1.3))
    assert result["eps_upper"] == pytest.approx(result["eps_gdp"], rel=1e-3)


@pytest.mark.parametrize("argv, match", [
    (["--mechanism", "subsampled-gaussian", "--mu", "1", "--sampling-prob", "1.5", "--delta", "1e-5"], "sampling-prob"),
    (["--mechanism", "subsampled-gaussian", "--mu", "1", "--sampling-prob", "0", "--delta", "1e-5"], "sampling-prob"),
    (["--mechanism", "gaussian", "--mu", "1", "--delta", "0"], "--delta"),
    (["--mechanism", "gaussian", "--mu", "-2", "--delta", "1e-5"], "--mu"),
    (["--mechanism", "subsampled-gaussian", "--mu", "1", "--delta", "1e-5"], "needs --sampling-prob"),
    (["--mechanism", "laplace", "--mu", "1", "--delta", "1e-5"], "invalid choice"),
])
def test_nonsense_inputs_fail_with_one_line(capsys, argv, match):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and match in err


def test_reachable_as_python_m_pipeline_account(repo):
    res = subprocess.run([sys.executable, "-m", "pipeline", "account", "--mechanism", "gaussian", "--mu", "0.5",
                          "--delta", "1e-5", "--discretisation", "1e-3", "--no-lower"],
                         cwd=repo, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["eps_lower"] is None


def test_noise_multiplier_is_one_over_mu(capsys):
    common = ["--mechanism", "gaussian", "--delta", "1e-5", "--discretisation", "1e-3", "--no-lower"]
    _, by_mu, _ = run(capsys, *common, "--mu", "0.5")
    _, by_sigma, _ = run(capsys, *common, "--noise-multiplier", "2")
    assert json.loads(by_mu)["eps_gdp"] == json.loads(by_sigma)["eps_gdp"]


def _no_constant(name):
    raise ValueError(f"not JSON: {name}")


def _plausible(lo, hi):
    """Numbers a user might mean (log-uniform on [lo, hi]), so examples also reach the accountants."""
    return st.floats(math.log10(lo), math.log10(hi)).map(lambda e: 10.0 ** e)


_ANY = st.floats()  # every double, inf and nan included


def _number(*plausible):
    """A plausible value (so examples get past validation) or any double at all."""
    return st.one_of(*plausible, _ANY)


_NUMBERS = {
    "--mu": _number(_plausible(1e-3, 1e3), _plausible(1e-120, 1e120)),
    "--noise-multiplier": _number(_plausible(1e-3, 1e3)),
    "--sampling-prob": _number(_plausible(1e-320, 1.0), st.just(1.0)),
    "--delta": _number(_plausible(1e-320, 0.9)),
    "--discretisation": _number(_plausible(1e-8, 0.5)),
    "--log-mass-truncation": _number(st.floats(-1e3, -1e-3)),
    "--compositions": st.one_of(st.integers(), st.integers(1, 10**6), st.integers(2**53 - 2, 2**53 + 2)),
}


@st.composite
def _argv(draw):
    mechanism = draw(st.sampled_from(["gaussian", "subsampled-gaussian"]))
    argv = [f"--mechanism={mechanism}"]
    noise = draw(st.sampled_from(["--mu", "--noise-multiplier"]))
    argv.append(f"{noise}={draw(_NUMBERS[noise])}")
    for flag in ("--sampling-prob", "--delta", "--discretisation", "--log-mass-truncation", "--compositions"):
        required = flag == "--delta" or (flag == "--sampling-prob" and mechanism == "subsampled-gaussian")
        if required or draw(st.booleans()):
            argv.append(f"{flag}={draw(_NUMBERS[flag])}")
    if draw(st.booleans()):
        argv.append("--no-lower")
    return argv


def test_every_numeric_input_gives_strict_json_or_one_line_error():
    # a small grid limit keeps each example fast; the limit's own value is tested below
    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_argv())
    def check(argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            code = main(argv)
        out, err = out.getvalue(), err.getvalue()
        assert "Traceback" not in err and not warned, (argv, [str(w.message) for w in warned])
        if code == 2:
            assert out == "" and err.startswith("error: ") and err.count("\n") == 1, (argv, err)
            return
        assert code == 0, (argv, code, err)
        result = json.loads(out, parse_constant=_no_constant)
        for key in {"eps_gdp", "eps_upper", "eps_lower", "eps_rdp", "eps_clt", "eps_edgeworth"} & result.keys():
            value = result[key]
            assert value is None or value >= 0, (argv, key, value)
            if value is None and key in ("eps_gdp", "eps_upper", "eps_rdp", "eps_clt"):
                assert key in result.get("notes", {}), (argv, key)  # every null says why
        assert 0.5 <= result["asr_upper"] <= 1

    with mock.patch.object(cli, "MAX_PLD_POINTS", 200_000):
        check()


@pytest.mark.parametrize("mechanism", [["--mechanism", "gaussian"],
                                       ["--mechanism", "subsampled-gaussian", "--sampling-prob", "0.5"]])
def test_a_huge_mu_is_answered_without_building_a_huge_grid(capsys, mechanism):
    # mu = 1e4 asks for a 1e12-point PLD: refused before allocation; GDP (closed form) or RDP still bound eps
    code, out, _ = run(capsys, *mechanism, "--mu", "1e4", "--delta", "1e-5")
    result = json.loads(out, parse_constant=_no_constant)
    assert code == 0 and result["eps_upper"] is None and result["eps_lower"] is None
    assert f"limit {cli.MAX_PLD_POINTS:.3g}" in result["notes"]["eps_upper"]
    certified = result["eps_gdp"] if mechanism[1] == "gaussian" else result["eps_rdp"]
    assert certified > 1e4 ** 2 / 2 - 10 * 1e4  # eps(delta) of G_mu is mu^2/2 - O(mu sqrt(log 1/delta))
    assert result["asr_from"] == ("eps_gdp" if mechanism[1] == "gaussian" else "eps_rdp")
    if mechanism[1] == "gaussian":
        assert result["eps_gdp"] == pytest.approx(acc.gdp_epsilon(1e-5, 1e4), rel=1e-12)


def test_mu_beyond_the_clt_overflow_still_reports_the_pld_bound(capsys):
    # e^{mu^2} overflows for mu > 26.6: the CLT estimate is null, the certified bounds are not
    code, out, _ = run(capsys, "--mechanism", "subsampled-gaussian", "--mu", "27", "--sampling-prob", "0.01",
                       "--delta", "1e-5", "--discretisation", "1e-2", "--no-lower")
    result = json.loads(out, parse_constant=_no_constant)
    assert code == 0 and result["eps_clt"] is None and "overflows" in result["notes"]["eps_clt"]
    assert result["eps_upper"] == pytest.approx(
        acc.pld_epsilon(acc.outputwise_event(27.0, 0.01, 1), 1e-5, settings=acc.PLDSettings(1e-2)))


def test_a_delta_below_the_truncated_mass_is_null_with_a_reason_not_infinity(capsys):
    code, out, _ = run(capsys, "--mechanism", "subsampled-gaussian", "--mu", "1", "--sampling-prob", "0.01",
                       "--compositions", "10", "--delta", "1e-30", "--discretisation", "1e-3")
    result = json.loads(out, parse_constant=_no_constant)  # the old output held the token Infinity
    assert code == 0 and result["eps_upper"] is None and "log-mass-truncation" in result["notes"]["eps_upper"]
    assert result["asr_from"] == "eps_rdp" and result["eps_rdp"] > 0


@pytest.mark.parametrize("h", ["2.2250738585e-313", "5.063129624349869e-30"])
def test_a_grid_finer_than_the_loss_indices_hold_is_a_one_line_error(capsys, h):
    # found by the property test above: a denormal step overflowed the PLD's int64 loss indices
    code, out, err = run(capsys, "--mechanism", "subsampled-gaussian", "--noise-multiplier", "1.0", "--sampling-prob",
                         "0.1", "--delta", "0.01", "--discretisation", h, "--compositions", "5")
    assert code == 2 and out == "" and err.startswith("error: --discretisation must be >= 1e-10")
    assert err.count("\n") == 1
