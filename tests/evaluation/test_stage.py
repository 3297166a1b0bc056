"""Stage evaluate_samples from files through the CLI: one flat JSON row per sample set."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.io import Split, read_json, save_split

#: the tests' sizes; every other key takes the schema default
EVALUATION = {"kid_subsets": 10, "kid_subset_size": 100,
              "evalnet": {"width": 16, "feature_dim": 64, "batch_size": 32, "lr": 0.003},
              "downstream": {"cnn_epochs": 3, "mlp_hidden": 32, "repeats": 2}}
KEYS = {"name", "n_samples", "n_test", "feature_extractor", "fid", "kid_mean", "kid_std", "kid_subset_size",
        "precision", "recall", "prc_neighborhood", "label_consistency", "acc_logreg", "acc_mlp", "acc_cnn",
        "acc_logreg_std", "acc_mlp_std", "acc_cnn_std", "fid_class_mean", "seed", "wall_s",
        *(f"fid_class_{c}" for c in range(10))}


def _run(split_files, evalnet, out, *, samples=None, params=None) -> int:
    return main(["evaluate_samples",
                 "--in", f"samples={samples or split_files['real']}", f"test={split_files['test']}",
                 f"evalnet={evalnet}",
                 "--out", f"metrics={out}",
                 "--params", json.dumps(params if params is not None else
                                        {"evaluation": EVALUATION, "seed": 0, "device": "cpu", "name": "real"})])


def test_cli_writes_one_flat_row_of_every_metric(split_files, evalnet, tmp_path):
    out = tmp_path / "metrics.json"
    assert _run(split_files, evalnet, out) == 0
    row = read_json(out)
    assert set(row) == KEYS
    assert row["name"] == "real" and row["feature_extractor"] == "evalnet"
    assert row["n_samples"] == row["n_test"] == 600
    # one level deep, scalars only: the report stage turns keys into Parquet columns
    assert all(v is None or isinstance(v, (int, float, str)) for v in row.values())
    assert row["label_consistency"] > 0.7 and row["acc_logreg"] > 0.6 and row["precision"] > 0.8
    assert row["acc_cnn_std"] >= 0  # two classifier seeds: a spread is reported


def test_val_adds_its_own_columns_and_moves_no_test_number(split_files, evalnet, tmp_path, digits):
    """Selection rules read fid_val / acc_*_val; every column scored on test is what it was without val."""
    val_file = tmp_path / "val.npz"
    save_split(val_file, digits.test.subset(np.arange(200)), name="val", source="test subset", seed=0)
    plain, with_val = tmp_path / "plain.json", tmp_path / "with_val.json"
    assert _run(split_files, evalnet, plain) == 0
    params = {"evaluation": EVALUATION, "seed": 0, "device": "cpu", "name": "real"}
    assert main(["evaluate_samples", "--in", f"samples={split_files['real']}", f"test={split_files['test']}",
                 f"val={val_file}", f"evalnet={evalnet}", "--out", f"metrics={with_val}",
                 "--params", json.dumps(params)]) == 0
    a, b = read_json(plain), read_json(with_val)
    assert set(b) - set(a) == {"fid_val", "acc_logreg_val", "acc_mlp_val", "acc_cnn_val"}
    assert {k: v for k, v in b.items() if k in a and k != "wall_s"} == {k: v for k, v in a.items() if k != "wall_s"}
    assert b["acc_logreg_val"] > 0.6 and 0 <= b["fid_val"] < 100


def test_noise_samples_score_worse_on_every_metric(split_files, evalnet, tmp_path, digits):
    noise_file = tmp_path / "noise.npz"
    save_split(noise_file, digits.noise_like(digits.real), name="noise", source="uniform noise", seed=1)
    real_out, noise_out = tmp_path / "real.json", tmp_path / "noise.json"
    assert _run(split_files, evalnet, real_out) == 0
    assert _run(split_files, evalnet, noise_out, samples=noise_file) == 0
    real, noise = read_json(real_out), read_json(noise_out)
    for lower_is_better in ("fid", "kid_mean", "fid_class_mean"):
        assert noise[lower_is_better] > real[lower_is_better], lower_is_better
    for higher_is_better in ("precision", "recall", "label_consistency", "acc_logreg", "acc_mlp", "acc_cnn"):
        assert noise[higher_is_better] < real[higher_is_better], higher_is_better


def test_help_lists_inputs_outputs_and_params(capsys):
    with pytest.raises(SystemExit) as done:
        main(["evaluate_samples", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "samples=PATH test=PATH evalnet=PATH" in text and "metrics=PATH" in text
    assert all(p in text for p in ("evaluation:", "seed:", "device:", "name:"))


@pytest.mark.parametrize("missing", ["samples", "evalnet"])
def test_a_missing_input_file_is_one_line(split_files, evalnet, tmp_path, capsys, missing):
    absent = tmp_path / f"absent-{missing}"
    args = {"samples": split_files["real"], "evalnet": evalnet, missing: absent}
    rc = main(["evaluate_samples", "--in", f"samples={args['samples']}", f"test={split_files['test']}",
               f"evalnet={args['evalnet']}", "--out", f"metrics={tmp_path / 'm.json'}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and str(absent) in err
    assert not (tmp_path / "m.json").exists()


def test_samples_of_another_shape_are_one_line(split_files, evalnet, tmp_path, capsys, digits):
    rgb = tmp_path / "rgb.npz"
    save_split(rgb, Split(np.repeat(digits.real.images, 3, axis=1), digits.real.labels), name="rgb", source="t", seed=0)
    assert _run(split_files, evalnet, tmp_path / "m.json", samples=rgb) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "samples are [3, 16, 16] images but test images are [1, 16, 16]" in err


def test_a_misspelt_evaluation_key_is_one_line(split_files, evalnet, tmp_path, capsys):
    params = {"evaluation": {"kid_subset": 10}, "device": "cpu"}
    assert _run(split_files, evalnet, tmp_path / "m.json", params=params) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "evaluation.kid_subset: unknown key (did you mean 'kid_subsets'?)" in err


def test_train_evalnet_cli_reports_test_accuracy(split_files, tmp_path):
    model, metrics = tmp_path / "net.pt", tmp_path / "net.json"
    rc = main(["train_evalnet", "--in", f"train={split_files['eval_train']}", f"test={split_files['test']}",
               "--out", f"model={model}", f"metrics={metrics}",
               "--params", json.dumps({"evalnet": {"width": 4, "feature_dim": 8, "epochs": 1}, "device": "cpu"})])
    assert rc == 0 and model.is_file()
    assert 0 <= read_json(metrics)["test_accuracy"] <= 1


def test_a_sample_label_outside_the_test_classes_is_one_line(digits, evalnet):
    from pipeline.evaluation import evaluate
    from pipeline.stage import PipelineError

    labels = digits.real.labels.copy()
    labels[5] = 10
    with pytest.raises(PipelineError, match=r"sample label 10 is not a class of the test split \(0..9\)"):
        evaluate(Split(digits.real.images, labels), digits.test, evalnet_path=evalnet, device="cpu")


# --------------------------------------------------------------------------- domain rate (STRAIGHTDP Table 5)

@pytest.fixture(scope="module")
def letters():
    """STRAIGHTDP's wrong-domain public set at the tests' size: printed letters (train, held out)."""
    from pipeline.data.printed_digits import printed_letters

    return printed_letters(400, 16, seed=0), printed_letters(200, 16, seed=1)


def test_domain_rate_places_real_digits_private_and_letters_public(digits, letters):
    from pipeline.evaluation.stage import domain_rate

    public, held_out = letters
    assert domain_rate(digits.real, digits.test, public) > 0.9
    assert domain_rate(held_out, digits.test, public) < 0.15
    mixed = Split(np.concatenate([digits.real.images[:100], held_out.images[:100]]), np.zeros(200, dtype=np.int64))
    assert 0.35 < domain_rate(mixed, digits.test, public) < 0.65


def test_domain_rate_is_a_key_only_when_the_public_split_is_given(split_files, evalnet, letters, tmp_path,
                                                                  monkeypatch):
    # the other metrics are tested above; stubbed here so only the wiring of the new key runs
    import pipeline.evaluation.downstream as downstream
    import pipeline.evaluation.fidelity as fidelity

    monkeypatch.setattr(fidelity, "fidelity_metrics", lambda *a, **k: {"fid": 1.0})
    monkeypatch.setattr(downstream, "downstream_accuracy", lambda *a, **k: {})
    public = tmp_path / "public.npz"
    save_split(public, letters[0], name="public", source="printed letters", seed=0)
    base = ["evaluate_samples", "--in", f"samples={split_files['real']}", f"test={split_files['test']}",
            f"evalnet={evalnet}", "--params", json.dumps({"evaluation": EVALUATION, "device": "cpu"})]
    assert main([*base[:5], f"public={public}", *base[5:], "--out", f"metrics={tmp_path / 'with.json'}"]) == 0
    assert main([*base, "--out", f"metrics={tmp_path / 'without.json'}"]) == 0
    assert read_json(tmp_path / "with.json")["domain_rate"] > 0.9
    assert "domain_rate" not in read_json(tmp_path / "without.json")


@pytest.fixture(scope="module")
def clip_file(split_files, tmp_path_factory):
    """A small CLIP trained by the train_clip stage (here on the eval-train digits, to keep the test short)."""
    from pipeline.evaluation.clip import train_clip

    root = tmp_path_factory.mktemp("clip")
    train_clip({"public": split_files["eval_train"]}, {"model": root / "clip.pt", "metrics": root / "clip.json"},
               {"clip": {"steps": 150, "groups": 8, "lr": 3e-3, "width": 32, "layers": 1, "embed_dim": 16,
                         "patch_size": 4}, "seed": 0})
    return root / "clip.pt"


def test_clip_adds_its_two_columns_moves_nothing_else_and_tells_digits_from_noise(split_files, evalnet, clip_file,
                                                                                 tmp_path, digits):
    params = json.dumps({"evaluation": EVALUATION, "seed": 0, "device": "cpu", "name": "real"})
    plain = tmp_path / "plain.json"
    assert _run(split_files, evalnet, plain) == 0
    rows = {}
    noise = tmp_path / "noise.npz"
    save_split(noise, digits.noise_like(digits.real), name="noise", source="test", seed=0)
    for name, samples in (("real", split_files["real"]), ("noise", noise)):
        rows[name] = tmp_path / f"{name}_clip.json"
        assert main(["evaluate_samples", "--in", f"samples={samples}", f"test={split_files['test']}",
                     f"evalnet={evalnet}", f"clip={clip_file}", "--out", f"metrics={rows[name]}",
                     "--params", params]) == 0
    a, b, n = read_json(plain), read_json(rows["real"]), read_json(rows["noise"])
    assert set(b) - set(a) == {"clip_fd", "clip_zero_shot_acc"}
    assert {k: v for k, v in b.items() if k in a and k != "wall_s"} == {k: v for k, v in a.items() if k != "wall_s"}
    assert b["clip_zero_shot_acc"] > 0.5 > n["clip_zero_shot_acc"] and b["clip_fd"] < n["clip_fd"]


def test_a_sharded_runs_features_score_its_joined_samples_as_its_own_would(split_files, evalnet, tmp_path, digits,
                                                                          capsys):
    """extract_features on two shards of the samples, handed to evaluate_samples as features_0, features_1: every
    column equals the unsharded evaluation's (FID/KID/precision-recall to 1e-6); features of another feature space
    and a gap in the shard numbering are one-line errors."""
    real = digits.real
    shard_inputs = []
    for k, (a, b) in enumerate([(0, 250), (250, len(real))]):
        part = tmp_path / f"shard{k}.npz"
        save_split(part, real.subset(np.arange(a, b)), name="shard", source="test", seed=0)
        feats = tmp_path / f"shard{k}.features.npz"
        assert main(["extract_features", "--in", f"samples={part}", f"evalnet={evalnet}", "--out", f"features={feats}",
                     "--params", json.dumps({"evaluation": EVALUATION, "device": "cpu"})]) == 0
        shard_inputs.append(f"features_{k}={feats}")
    params = json.dumps({"evaluation": EVALUATION, "seed": 0, "device": "cpu", "name": "real"})
    plain, merged = tmp_path / "plain.json", tmp_path / "merged.json"
    assert _run(split_files, evalnet, plain) == 0
    assert main(["evaluate_samples", "--in", f"samples={split_files['real']}", f"test={split_files['test']}",
                 f"evalnet={evalnet}", *shard_inputs, "--out", f"metrics={merged}", "--params", params]) == 0
    a, b = read_json(plain), read_json(merged)
    assert a.keys() == b.keys()
    for key in a.keys() - {"wall_s"}:
        assert b[key] == (pytest.approx(a[key], rel=1e-6, abs=1e-9) if isinstance(a[key], float) else a[key]), key
    inception = {**EVALUATION, "feature_extractor": "inception-v3-compat"}
    assert main(["evaluate_samples", "--in", f"samples={split_files['real']}", f"test={split_files['test']}",
                 f"evalnet={evalnet}", shard_inputs[1].replace("features_1", "features_0"), "--out",
                 f"metrics={tmp_path / 'x.json'}", "--params",
                 json.dumps({"evaluation": inception, "seed": 0, "device": "cpu"})]) == 2
    assert main(["evaluate_samples", "--in", f"samples={split_files['real']}", f"test={split_files['test']}",
                 f"evalnet={evalnet}", shard_inputs[1], "--out", f"metrics={tmp_path / 'y.json'}",
                 "--params", params]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "expected dpgen-features/1 in 'inception-v3-compat'" in errors[0] and "features_0 .." in errors[1]
