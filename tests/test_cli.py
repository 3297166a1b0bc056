"""The thin CLI: every stage has --help, and wrong usage is one line, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.cli import STAGES, main


def test_every_registered_stage_loads_and_has_help(capsys):
    for name in STAGES:
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert f"python -m pipeline {name}" in out and "outputs:" in out


def test_top_level_help_lists_stages(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in STAGES)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no_such_stage"], "error: unknown stage 'no_such_stage'"),
        (["prepare_data", "--out", "private_train=a.npz"], "error: stage prepare_data: missing --out eval_train, reference, test"),
        (["prepare_data", "--out", "bogus"], "error: --out 'bogus': expected KEY=PATH"),
        (["prepare_data", "--out", "private_train=a", "eval_train=b", "reference=r", "test=c", "extra=d"],
         "error: stage prepare_data: unknown --out key 'extra'"),
        (["collect_table", "--out", "table=t.parquet", "--params", "{bad json"], "error: --params: not valid JSON"),
    ],
)
def test_usage_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "pipeline", "--help"], capture_output=True, text=True, check=True)
    assert "prepare_data" in out.stdout
