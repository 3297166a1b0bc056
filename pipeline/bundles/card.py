"""A bundle's model card: ``README.md`` with the Hugging Face metadata block, written with ``huggingface_hub``.

The metadata carries the certificate's privacy claim under ``differential_privacy`` (eps, delta, accountant,
adjacency, mechanisms, the private split's sha256) beside the Hub's own keys (``model_name``, ``datasets``,
``tags``, ``library_name`` and ``model-index`` with the test-split metrics), so a Hub page shows the claim and
:func:`check` can hold the card to the certificate: a card whose claim was edited after export is refused even
when its sha256 in the certificate was edited too. The Hub's server-side ``ModelCard.validate`` needs the network;
offline, the card is parsed by ``ModelCard.load`` and its ``model-index`` read back into ``EvalResult`` objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: the certificate keys the card's ``differential_privacy`` block repeats (and :func:`check` compares); what the eps
#: covers and does not is part of the claim, so a card or certificate that rewrites it is refused like a changed eps
CLAIM_KEYS = ("epsilon", "delta", "accountant", "adjacency", "mechanisms", "data_sha256", "epsilon_target", "covers",
              "not_covered")
#: the card body's heading of each statement of scope (the certificate's key -> the heading its bullets follow)
SCOPE_HEADINGS = {"covers": "What the eps covers:", "not_covered": "What it does not cover:"}
#: test-split metric -> its name on the card
METRIC_NAMES = {"fid": "FID", "kid_mean": "KID", "precision": "precision", "recall": "recall",
                "acc_logreg": "downstream accuracy (logistic regression)", "acc_mlp": "downstream accuracy (MLP)",
                "acc_cnn": "downstream accuracy (CNN)", "clip_fd": "CLIP Frechet distance",
                "clip_zero_shot_acc": "CLIP zero-shot accuracy"}


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-") or "private-data"


def _card_data(certificate: Mapping[str, Any], metrics: Mapping[str, float]) -> Any:
    from huggingface_hub import EvalResult, ModelCardData

    name = f"{certificate['method']}/{certificate['run']}"
    dataset = certificate.get("dataset") or "private data"
    results = [EvalResult(task_type="image-generation", task_name="class-conditional image generation",
                          dataset_type=_slug(dataset), dataset_name=dataset, dataset_split="test",
                          metric_type=key, metric_name=METRIC_NAMES[key], metric_value=float(metrics[key]))
               for key in METRIC_NAMES if key in metrics]
    return ModelCardData(
        model_name=name, library_name=certificate.get("library_name"),
        datasets=[_slug(dataset)], tags=["differential-privacy", certificate["method"], certificate["kind"]],
        eval_results=results or None,
        differential_privacy={k: certificate.get(k) for k in CLAIM_KEYS} | {"certified": True})


def render(certificate: Mapping[str, Any], metrics: Mapping[str, float]) -> str:
    """The card's text: metadata block, then what the run is, its claim, what it covers and not, how to check it."""
    from huggingface_hub import ModelCard

    name = f"{certificate['method']}/{certificate['run']}"
    contents = certificate.get("contents") or []
    what = (", ".join(f"{c['what']} (`{c['path']}`)" for c in contents) + ", what the run's sampler reads, and the "
            "run's own samples" if certificate["kind"] == "model" else "the run's synthetic set, its private output")
    lines = [
        f"# {name}: a differentially private {certificate['method']} run", "",
        f"This bundle holds {what}, the ledger transcripts that certify it and their replay.", "",
        "## Privacy claim", "",
        f"- **({certificate['epsilon']:.4g}, {certificate['delta']:.3g})-DP** with respect to "
        f"{certificate['adjacency']} neighbouring datasets of the private split "
        f"(sha256 `{certificate['data_sha256']}`), certified by the `{certificate['accountant']}` accountant "
        f"from the transcripts in `ledger/` (mechanisms: {certificate['mechanisms']}).",
        f"- Target eps of the run: {certificate.get('epsilon_target')}.", "",
        *[line for key, heading in SCOPE_HEADINGS.items()
          for line in (heading, "", *[f"- {c}" for c in certificate.get(key) or []], "")],
        "## Metrics on the test split", "",
        *([f"- {METRIC_NAMES.get(k, k)}: {v:.4g}" for k, v in sorted(metrics.items())] or ["- none recorded"]), "",
        "## How to check and use it", "",
        "```", "python -m pipeline verify_bundle <this folder>   # exit 0, or one line naming what failed",
        "python -m pipeline sample_bundle <this folder> --n 100 --out samples.npz" if certificate["kind"] == "model"
        else "# samples.npz is the synthetic set (drawing more would be a new release)", "```", "",
        f"Exported by code version `{certificate['code_version']}` ({certificate['code_version_note']}).", ""]
    return ModelCard.from_template(_card_data(certificate, metrics), template_str="---\n{{ card_data }}\n---\n\n"
                                   + "\n".join(lines)).content


def listed_under(text: str, heading: str) -> list[str] | None:
    """The bullets the card's body lists under ``heading`` (up to the next line that is neither a bullet nor blank);
    None when the heading is absent or repeated (a second list would be a second, unchecked statement)."""
    lines = text.splitlines()
    if lines.count(heading) != 1:
        return None
    items = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("- "):
            items.append(line[2:])
        elif line.strip():
            break
    return items


def _check_scope(path: Path, text: str, certificate: Mapping[str, Any]) -> None:
    """The body's lists of what the eps covers and does not are the certificate's: they are what a reader of the card
    reads, so a rewritten one is refused (BundleError naming the field)."""
    from pipeline.bundles.errors import BundleError

    for key, heading in SCOPE_HEADINGS.items():
        stated = list(certificate.get(key) or [])
        shown = listed_under(text, heading)
        if shown != stated:
            raise BundleError(f"{path}: the card's list under {heading!r} ({shown!r}) is not the certificate's {key} "
                              f"({stated!r})")


def check(path: str | Path, certificate: Mapping[str, Any]) -> dict[str, Any]:
    """Parse the card and hold its claim to the certificate's; its metadata, or BundleError in one line."""
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    from pipeline.bundles.errors import BundleError

    path = Path(path)
    try:
        card = ModelCard.load(path)
        card_data = card.data
        data = card_data.to_dict()
        if "model-index" in data:
            model_index_to_eval_results(data["model-index"])
        # the Hub folds model_name into model-index when there are results: read it back from the parsed card
        data["model_name"] = card_data.model_name
    except Exception as exc:  # noqa: BLE001 -- any parse failure of a card is the same one-line refusal
        raise BundleError(f"{path}: not a model card huggingface_hub can read ({type(exc).__name__}: {exc})") \
            from None
    claim = data.get("differential_privacy") or {}
    wrong = [k for k in CLAIM_KEYS if claim.get(k) != certificate.get(k)]
    if wrong or claim.get("certified") is not True:
        k = wrong[0] if wrong else "certified"
        raise BundleError(f"{path}: the card's differential_privacy.{k} ({claim.get(k)!r}) is not the "
                          f"certificate's ({certificate.get(k, True)!r})")
    if data.get("model_name") != f"{certificate['method']}/{certificate['run']}":
        raise BundleError(f"{path}: the card names model {data.get('model_name')!r}, the certificate "
                          f"{certificate['method']}/{certificate['run']}")
    _check_scope(path, card.text, certificate)
    return data
