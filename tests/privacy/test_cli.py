"""``python -m pipeline account``: JSON answers, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.privacy import accountants as acc
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
