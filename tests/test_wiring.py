"""The house the methods' wiring stands on (pipeline/wiring.py): the results tree, stage params, the binding."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from pipeline.config import config_id, validate_config
from pipeline.wiring import RUNTIME_PARAMS, House, Layout, io_args, stage_params


def house(tmp_path: Path, **overrides) -> House:
    cfg = yaml.safe_load((Path(__file__).parents[1] / "config.yaml").read_text())
    cfg.update(results_dir=str(tmp_path / "r"), **overrides)
    return House.from_config(validate_config(cfg))


def test_the_layout_puts_jobs_files_under_the_experiment_and_what_a_reader_opens_at_the_top(tmp_path):
    lay = Layout(tmp_path, "exp")
    assert lay.expdir == tmp_path / "exp" and lay.data == tmp_path / "exp" / "data"
    assert lay.tables == tmp_path / "tables" and lay.figures == tmp_path / "figures"
    assert lay.split("val") == tmp_path / "exp" / "data" / "val.npz"
    assert lay.ledger("train_dpdm_x") == tmp_path / "exp" / "ledger" / "train_dpdm_x.jsonl"
    assert lay.benchmark("replay") == tmp_path / "exp" / "benchmarks" / "replay" / "job.tsv"
    assert lay.benchmark("sample_dpdm", "run/sampler") == tmp_path / "exp" / "benchmarks" / "sample_dpdm" / "run" / "sampler.tsv"
    assert lay.replay_report == tmp_path / "exp" / "ledger" / "replay.json"


def test_stage_params_carry_the_id_of_what_the_output_depends_on_and_nothing_else():
    a = json.loads(stage_params(epsilon=1.0, seed=0, device="cpu", threads=2, ledger_binding={"run": "x"}))
    b = json.loads(stage_params(epsilon=1.0, seed=0, device="cuda", threads=8, checkpoint_every_s=60))
    assert a["config_id"] == b["config_id"] == config_id({"epsilon": 1.0, "seed": 0})
    assert set(RUNTIME_PARAMS) == {"device", "threads", "checkpoint_every_s", "ledger_binding", "batch_gpu"}
    # a setting that changes the output changes the id
    assert json.loads(stage_params(epsilon=2.0, seed=0))["config_id"] != a["config_id"]


def test_io_args_quote_every_path_for_the_shell():
    line = io_args("--in", {"data": "out dir/x.npz", "init": Path("m.pt")})
    assert shlex.split(line) == ["--in", "data=out dir/x.npz", "init=m.pt"]


def test_the_house_reads_its_config(tmp_path):
    h = house(tmp_path, methods=["dpdm", "straightdp"])
    assert h.method_on("dpdm") and not h.method_on("empden")
    assert h.ledger_binding("r1") == {"run": "r1", "experiment": h.config["experiment"]}
    assert h.private == {"N": h.config["data"]["private"]["n_private_train"], "n_classes": 10}
    assert h.torch_threads >= 1 and h.seed == h.config["seed"]


def test_the_data_splits_follow_the_public_and_toy_sections(tmp_path):
    h = house(tmp_path)
    core = {"private_train", "eval_train", "reference", "val", "test"}
    assert set(h.data_splits()) == core | {"public"} | ({"toy"} if h.config["data"]["toy"]["enabled"] else set())
    cfg = dict(h.config, data={**h.config["data"], "public": {**h.config["data"]["public"], "source": "none"},
                               "toy": {**h.config["data"]["toy"], "enabled": False}})
    assert set(House(cfg, h.layout, 1).data_splits()) == core
