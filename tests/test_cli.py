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
        (["prepare_data", "--out", "private_train=a.npz"],
         "error: stage prepare_data: missing --out eval_train, reference, val, test"),
        (["prepare_data", "--out", "bogus"], "error: --out 'bogus': expected KEY=PATH"),
        (["prepare_data", "--out", "private_train=a", "eval_train=b", "reference=r", "val=v", "test=c", "extra=d"],
         "error: stage prepare_data: unknown --out key 'extra'"),
        (["collect_table", "--out", "table=t.parquet", "--params", "{bad json"], "error: --params: not valid JSON"),
        (["train_dpdm", "--nproc", "two"], "error: --nproc: expected an integer >= 1, got 'two'"),
        (["train_dpdm", "--nproc", "0"], "error: --nproc: expected an integer >= 1, got '0'"),
        (["sample_dpdm", "--nproc", "2"], "error: --nproc 2: stage sample_dpdm does not run data-parallel (only "
                                          "train_dpdm, train_straightdp)"),
    ],
)
def test_usage_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "pipeline", "--help"], capture_output=True, text=True, check=True)
    assert "prepare_data" in out.stdout


def _fake_stage(monkeypatch, fn):
    """Register ``fn`` as the stage ``fake`` (no inputs or outputs)."""
    from pipeline.stage import stage

    monkeypatch.setitem(sys.modules, "fake_stage_module", type(sys)("fake_stage_module"))
    sys.modules["fake_stage_module"].fake = stage("fake")(fn)
    monkeypatch.setitem(STAGES, "fake", "fake_stage_module:fake")


def test_with_log_the_stage_output_goes_to_the_log_and_a_bad_input_to_the_console_too(monkeypatch, tmp_path, capfd):
    from pipeline.stage import PipelineError

    def fake(inputs, outputs, params):
        print("progress 1/2")
        raise PipelineError("input data: file x.npz is truncated")

    _fake_stage(monkeypatch, fake)
    log = tmp_path / "logs dir" / "fake.log"
    assert main(["fake", "--log", str(log)]) == 2
    out, err = capfd.readouterr()
    # Snakemake prints only the failed command: the console needs the cause, in one line
    assert err == "error: fake: input data: file x.npz is truncated\n" and out == ""
    text = log.read_text()
    assert "progress 1/2" in text and "error: input data: file x.npz is truncated" in text


def test_with_log_a_crash_keeps_its_traceback_in_the_log_and_names_it_on_the_console(monkeypatch, tmp_path, capfd):
    def fake(inputs, outputs, params):
        raise RuntimeError("CUDA out of memory\nsecond line")

    _fake_stage(monkeypatch, fake)
    log = tmp_path / "fake.log"
    assert main(["fake", "--log", str(log)]) == 1
    err = capfd.readouterr().err
    assert err == f"error: fake failed with RuntimeError: CUDA out of memory (traceback in {log})\n"
    assert "Traceback (most recent call last)" in log.read_text()


def test_with_log_a_successful_stage_prints_nothing_on_the_console(monkeypatch, tmp_path, capfd):
    import logging

    def fake(inputs, outputs, params):
        logging.getLogger("fake").warning("half way")
        print("done", file=sys.stderr)

    _fake_stage(monkeypatch, fake)
    log = tmp_path / "fake.log"
    assert main(["fake", "--log", str(log)]) == 0
    out, err = capfd.readouterr()
    assert out == err == ""
    assert "done" in log.read_text()


def test_every_stage_a_rule_runs_is_registered(repo):
    import re

    called = set()
    for smk in (repo / "rules").glob("*.smk"):
        called |= set(re.findall(r"python -m pipeline (\w+)", smk.read_text()))
    assert called and called <= set(STAGES), sorted(called - set(STAGES))


def test_each_method_lists_its_own_stages_and_the_cli_finds_them_all():
    from pipeline.cli import CORE_STAGES
    from pipeline.plugins import method_names, method_stages

    # the methods are the packages found under pipeline/methods/ (no list to edit): the paper methods among them
    assert {"accounting", "audit", "baselines", "dpdm", "empden", "empden_diagnostics", "sensgeo",
            "straightdp"} <= set(method_names()) and method_names() == sorted(method_names())
    per_method = method_stages()
    assert per_method["dpdm"]["train_dpdm"] == "pipeline.training.dp_denoiser:train_dp_denoiser"
    listed = [name for stages in [CORE_STAGES, *per_method.values()] for name in stages]
    assert sorted(listed) == sorted(STAGES) and len(listed) == len(set(listed))


def test_a_stage_claimed_by_two_methods_is_refused():
    from pipeline.plugins import merge_stages

    with pytest.raises(RuntimeError, match="stage 'x' of method 'b' is already registered by 'a'"):
        merge_stages({}, {"a": {"x": "m:x"}, "b": {"x": "n:x"}})
