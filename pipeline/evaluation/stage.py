"""Stage ``evaluate_samples``: every sample-quality metric of one set of samples, as JSON.

The one evaluation entry point every method calls (DPDM, EMPDEN, STRAIGHTDP, baselines):
give it a split of generated (image, label) pairs, the real ``test`` split and the eval
net, get one flat JSON object whose keys become Parquet columns in the report stage. The
"real data" reference row is this same stage with the held-out real ``reference`` split
(never seen by the eval net nor by any method) as the samples.

Keys (all floats unless noted; lower is better for fid*/kid*, higher for the rest):
``name`` (str, the params' name), ``n_samples``, ``n_test`` (int), ``feature_extractor``
(str), ``fid``, ``kid_mean``, ``kid_std``, ``kid_subset_size`` (int), ``precision``,
``recall``, ``prc_neighborhood`` (int, k), ``fid_class_<c>`` for each test class and
``fid_class_mean``, ``label_consistency``, ``acc_logreg``, ``acc_mlp``, ``acc_cnn``
(downstream test accuracy, mean over ``downstream.repeats`` classifier seeds) and
``acc_<classifier>_std`` (their standard deviation), ``seed`` (int), ``wall_s``. A metric
that does not apply (labels absent, classifier not selected, class too small) is ``null``.
With the optional input ``public`` (the method's public split, e.g. STRAIGHTDP's printed
letters) one more key, ``domain_rate``: the fraction of samples a real private-vs-public
classifier assigns to the private domain (STRAIGHTDP Table 5, "domain"); without it the key
is absent, so the rows of methods that do not ask for it are unchanged. With the optional
input ``val`` (the validation split), ``fid_val`` (FID against val) and ``acc_<classifier>_val``
(the same classifiers scored on val): what a rule that chooses among configurations reads
(never ``test``).

Samples whose label is negative count as unconditional: they enter FID/KID/PRC but not the
label-aware metrics or the downstream classifiers.

A sharded run (``sampling.shards``) hands in its shards' features (``--in features_0=... features_1=...``,
stage ``extract_features``, one per shard, in shard order): FID, KID, precision-recall and ``fid_val``
are computed from them merged instead of extracting the joined samples' own.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.device import resolve_device
from pipeline.evaluation.evalnet import evaluation_section, load_evalnet, load_labelled_split
from pipeline.io import Split, atomic_path, read_manifest, write_json
from pipeline.stage import PipelineError, numbered, stage

log = logging.getLogger(__name__)


#: at most this many images per domain train the domain classifier (enough for two domains
#: that differ in glyph shape, as the paper's MNIST vs KMNIST do)
DOMAIN_MAX_PER_DOMAIN = 2000
#: hidden units of the domain classifier
DOMAIN_HIDDEN = 128


def domain_rate(samples: Split, private: Split, public: Split, *, seed: int = 0,
                max_per_domain: int = DOMAIN_MAX_PER_DOMAIN) -> float:
    """Fraction of ``samples`` a real private-vs-public classifier assigns to the private domain.

    STRAIGHTDP Table 5's "domain" (App. D.1: "the fraction of samples a real MNIST-vs-KMNIST
    classifier assigns to the private domain"): a one-hidden-layer MLP on pixels in [0, 1]
    (a linear model leaves ~15% of held-out printed letters on the digit side at 16 x 16),
    trained on equally many real ``private`` (the held-out test split: scoring, no selection)
    and ``public`` images, so 0.5 is the rate of a sample set the classifier cannot place.
    """
    from sklearn.neural_network import MLPClassifier

    shapes = {samples.images.shape[1:], private.images.shape[1:], public.images.shape[1:]}
    if len(shapes) != 1:
        raise PipelineError(f"domain rate: samples, test and public images must share [C, H, W], got "
                            f"{list(samples.images.shape[1:])}, {list(private.images.shape[1:])}, "
                            f"{list(public.images.shape[1:])}")
    n = min(len(private), len(public), max_per_domain)
    if n < 1 or len(samples) < 1:
        raise PipelineError("domain rate: needs at least one private, one public and one sample image")
    rng = np.random.default_rng(seed)
    x = np.concatenate([private.images[rng.choice(len(private), n, replace=False)],
                        public.images[rng.choice(len(public), n, replace=False)]]).reshape(2 * n, -1) / 255.0
    y = np.concatenate([np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64)])
    clf = MLPClassifier(hidden_layer_sizes=(DOMAIN_HIDDEN,), max_iter=500, random_state=seed).fit(x, y)
    return float(np.mean(clf.predict(samples.images.reshape(len(samples), -1) / 255.0) == 1))


#: format of a features file (stage extract_features)
FEATURES_FORMAT = "dpgen-features/1"


def save_features(path: str | Path, features: Any, *, feature_extractor: str, samples_sha256: str) -> None:
    """One shard's features [n, D] with the feature space and the samples they are of (atomic)."""
    meta = {"format": FEATURES_FORMAT, "feature_extractor": feature_extractor, "samples_sha256": samples_sha256}
    with atomic_path(path, suffix=".npz") as tmp:
        np.savez(tmp, features=features.detach().cpu().numpy(), meta=np.array(json.dumps(meta)))


def load_features(paths: list[Path], *, feature_extractor: str) -> Any:
    """The features of ``paths`` (shard order) concatenated; each must be of ``feature_extractor``'s space."""
    import torch

    parts = []
    for path in paths:
        try:
            with np.load(path) as z:
                meta, features = json.loads(str(z["meta"])), z["features"]
        except (OSError, ValueError, KeyError) as exc:
            raise PipelineError(f"features {path}: unreadable ({exc}); rerun its extract_features job") from None
        if meta.get("format") != FEATURES_FORMAT or meta.get("feature_extractor") != feature_extractor:
            raise PipelineError(f"features {path}: {meta.get('format')} in {meta.get('feature_extractor')!r} space, "
                                f"expected {FEATURES_FORMAT} in {feature_extractor!r} (evaluation.feature_extractor)")
        parts.append(torch.from_numpy(features))
    return torch.cat(parts)


@stage("extract_features", inputs=("samples", "evalnet"), outputs=("features",),
       params={"evaluation": "the evaluation config section (feature_extractor, inception_weights, batch_size)",
               "device": "auto | cpu | cuda[:N]", "threads": "torch CPU threads (default 1)"})
def extract_features_stage(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """The features FID/KID/precision-recall read, of one shard's samples (``sampling.shards``): the evaluation of
    the joined samples merges them."""
    import torch

    from pipeline.evaluation.fidelity import extract_features

    torch.set_num_threads(int(params.get("threads", 1)))
    cfg = evaluation_section(params.get("evaluation"))
    samples = load_labelled_split(inputs["samples"], "samples")
    feats = extract_features(samples, evalnet_path=inputs["evalnet"], feature_extractor=cfg["feature_extractor"],
                             inception_weights=cfg["inception_weights"], batch_size=cfg["batch_size"],
                             device=resolve_device(params.get("device", "auto")))
    save_features(outputs["features"], feats, feature_extractor=cfg["feature_extractor"],
                  samples_sha256=str(read_manifest(inputs["samples"])["sha256"]))
    log.info("%s: features %s of %d samples", inputs["samples"], list(feats.shape[1:]), len(samples))


def evaluate(samples: Split, test: Split, *, evalnet_path: str | Path, evaluation: Mapping[str, Any] | None = None,
             seed: int = 0, device: str = "auto", verbose: bool = False, public: Split | None = None,
             val: Split | None = None, clip_path: str | Path | None = None,
             sample_features: Any = None) -> dict[str, Any]:
    """All metrics of ``samples`` against the real ``test`` split (see the module doc for keys).

    ``evaluation`` is the config's ``evaluation`` section (validated, defaults filled);
    ``public`` adds ``domain_rate`` (:func:`domain_rate`); ``val`` adds the FID against the
    validation split and the downstream accuracy on it (``fid_val``, ``acc_<classifier>_val``),
    which selection rules read; ``clip_path`` (a ``dpgen-clip/1`` file) adds ``clip_fd`` (Fréchet
    distance to test in CLIP image space) and ``clip_zero_shot_acc`` (the zero-shot class probe:
    the fraction of samples whose nearest caption is their conditioning label's). ``sample_features``
    (a sharded run's shards' features, merged): FID/KID/precision-recall and ``fid_val`` read them
    instead of extracting the samples' own.
    """
    # torch-fidelity (with torchvision) and scikit-learn take seconds to import: loaded here,
    # not at module level, so `python -m pipeline evaluate_samples --help` stays quick.
    from pipeline.evaluation.downstream import cnn_config, downstream_accuracy
    from pipeline.evaluation.fidelity import fid_only, fidelity_metrics, label_consistency

    cfg = evaluation_section(evaluation)
    dev = resolve_device(device)
    if samples.images.shape[1:] != test.images.shape[1:]:
        raise PipelineError(f"samples are {list(samples.images.shape[1:])} images but test images are "
                            f"{list(test.images.shape[1:])}: generate at the test split's [C, H, W]")
    n_classes = int(test.labels.max()) + 1
    bad = samples.labels[samples.labels >= n_classes]
    if bad.size:
        raise PipelineError(f"sample label {int(bad[0])} is not a class of the test split (0..{n_classes - 1})")
    start = time.perf_counter()
    out: dict[str, Any] = {"n_samples": len(samples), "n_test": len(test), "seed": seed}
    out.update(fidelity_metrics(
        samples, test, evalnet_path=evalnet_path, feature_extractor=cfg["feature_extractor"],
        inception_weights=cfg["inception_weights"], batch_size=cfg["batch_size"], kid_subsets=cfg["kid_subsets"],
        kid_subset_size=cfg["kid_subset_size"], prc_neighborhood=cfg["prc_neighborhood"], seed=seed, device=dev,
        verbose=verbose, sample_features=sample_features))
    if val is not None:
        out["fid_val"] = fid_only(samples, val, evalnet_path=evalnet_path, feature_extractor=cfg["feature_extractor"],
                                  inception_weights=cfg["inception_weights"], batch_size=cfg["batch_size"], device=dev,
                                  sample_features=sample_features)
    evalnet = load_evalnet(evalnet_path, device=dev)
    out["label_consistency"] = label_consistency(evalnet, samples, batch_size=cfg["batch_size"])
    down = cfg["downstream"]
    out.update(downstream_accuracy(samples, test, classifiers=down["classifiers"], seed=seed,
                                   repeats=down["repeats"], mlp_hidden=down["mlp_hidden"], cnn=cnn_config(cfg),
                                   device=dev, val=val))
    if public is not None:
        out["domain_rate"] = domain_rate(samples, test, public, seed=seed)
    if clip_path is not None:
        from pipeline.evaluation.clip import ClipModel, clip_fd

        out["clip_fd"] = clip_fd(samples, test, clip_path=clip_path, batch_size=cfg["batch_size"])
        out["clip_zero_shot_acc"] = ClipModel(clip_path).zero_shot_accuracy(samples)
    out["wall_s"] = time.perf_counter() - start
    return out


@stage(
    "evaluate_samples",
    inputs=("samples", "test", "evalnet"),
    optional_inputs=("public", "val", "clip"),
    numbered_inputs=("features",),  # features_0 .. features_<S-1> of a sharded run
    outputs=("metrics",),
    params={
        "evaluation": "the evaluation config section (feature_extractor, kid_*, prc_neighborhood, downstream, ...)",
        "seed": "integer seed (KID subsets, downstream classifiers)",
        "device": "auto | cpu | cuda[:N]",
        "threads": "torch CPU threads (default 1: the rule's declared threads, so two jobs do not share a core)",
        "name": "label of this row in the tables (e.g. the method and configuration)",
    },
)
def evaluate_samples(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """FID/KID/precision-recall, per-class FID, label consistency and downstream accuracy
    of a split of samples against the real test split (and the downstream accuracy on val, when given)."""
    import torch

    torch.set_num_threads(int(params.get("threads", 1)))
    samples = load_labelled_split(inputs["samples"], "samples")
    test = load_labelled_split(inputs["test"], "test")
    if not Path(inputs["evalnet"]).is_file():
        raise PipelineError(f"input evalnet: {inputs['evalnet']} not found (run the train_evalnet stage)")
    public = load_labelled_split(inputs["public"], "public") if "public" in inputs else None
    val = load_labelled_split(inputs["val"], "val") if "val" in inputs else None
    shard_features = numbered(inputs, "features", "evaluate_samples")
    features = (load_features(shard_features, feature_extractor=evaluation_section(params.get("evaluation"))[
        "feature_extractor"]) if shard_features else None)
    metrics = evaluate(samples, test, evalnet_path=inputs["evalnet"], evaluation=params.get("evaluation"),
                       seed=int(params.get("seed", 0)), device=params.get("device", "auto"), verbose=True,
                       public=public, val=val, clip_path=inputs.get("clip"), sample_features=features)
    metrics = {"name": str(params.get("name", Path(inputs["samples"]).stem)), **metrics}
    log.info("%s: fid %.3f, label consistency %s, downstream %s", metrics["name"], metrics["fid"],
             metrics["label_consistency"], {k: v for k, v in metrics.items() if k.startswith("acc_")})
    write_json(outputs["metrics"], metrics)

