"""A private run's certified bundle: its output (weights or synthetic set) with the transcripts that certify it.

Layout of ``results/bundles/<method>/<run>/`` (``dpgen-bundle/1``):

* ``certificate.json``: method, run, experiment, kind (``model`` or ``synthetic``), the certified eps (the run's
  lines composed and recomputed by the accountant they name: :func:`pipeline.results.all_runs.run_privacy`, the
  function all_runs.parquet's column comes from), delta, accountant, adjacency, the private split's sha256, what
  each transcript must be (its registration), the code version at export, what the eps covers and what it does
  not, and the sha256 of every other file of the bundle;
* ``README.md``: the model card (Hugging Face metadata block, :mod:`pipeline.bundles.card`);
* ``ledger/<transcript>.jsonl``: the run's transcripts, and ``replay.json``: their replay at export;
* kind ``model``: what the run's sampler reads, and ``sampling.json``, how the run sampled (so
  :func:`pipeline.bundles.sample.sample` redraws the run's own samples): ``weights/``, the trained network as
  safetensors in diffusers' layout or DP-MERF's generator (:mod:`pipeline.bundles.weights`); STRAIGHTDP's
  ``release/moments.npz``, the noisy class moments Stage 1 released (a plain ``.npz``, read without pickle), and its
  public parts, ``public/flow/`` (the public flow the guidance steers) and ``public/autoencoder/`` (the latent
  variant's decoder);
* ``samples.npz`` (+ its manifest ``samples.json``) and ``samples.png``: the run's synthetic set (for EMPDEN cells
  and Private Evolution the private output itself) and ``metrics.json``, its scores on the test split.

:func:`verify` is what a reader runs: every file against its sha256, the card against the certificate, every
transcript replayed against its registration, the composed eps against the stated one, the weights' training
metadata against the lines. What it cannot show: that the weights were trained by the mechanism the lines
describe (a forger who writes consistent lines and reruns nothing would pass); the one-run audit
(:mod:`pipeline.audit.one_run`) and the membership attacks are this project's evidence for that, and the
certificate is unsigned (publish its sha256 where readers can find it).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.bundles.errors import BundleError
from pipeline.io import Split, read_json
from pipeline.stage import PipelineError, stage

BUNDLE_FORMAT = "dpgen-bundle/1"
CERTIFICATE = "certificate.json"
CARD = "README.md"
SAMPLES = "samples.npz"
KINDS = ("model", "synthetic")
#: relative tolerance of the stated eps against the recomputed one (the certificate stores a float)
EPS_RTOL = 1e-9
#: how far the training stage's own eps (its meta) may be from the certified recompute of its lines
META_EPS_RTOL = 1e-2


# --------------------------------------------------------------------------- hashes

def _sha256(path: Path) -> str:
    from pipeline.training.public import file_sha256

    return file_sha256(path)


#: files of a bundle folder that are not the bundle's: Snakemake marks a finished directory output with this one
NOT_BUNDLE = (".snakemake_timestamp",)


def file_hashes(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` but the certificate (and Snakemake's marker)."""
    return {p.relative_to(root).as_posix(): _sha256(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p != root / CERTIFICATE and p.relative_to(root).as_posix() not in NOT_BUNDLE}


# --------------------------------------------------------------------------- export

#: what the certificate records of each transcript's registration: the replay holds the bundle's lines to it at
#: export and at every verification (its binding, and what the configuration ran: pipeline.privacy.replay.Registered)
REGISTRATION_KEYS = ("claims", "run", "stage", "phase", "delta", "data_sha256", "data_n", "configuration", "params",
                     "epsilon_target", "after", "rtol", "prior_lines")


def _registration(r: Any) -> dict[str, Any]:
    """A transcript's :class:`~pipeline.privacy.replay.Registered` as the certificate records it (plain JSON)."""
    out = {k: getattr(r, k) for k in REGISTRATION_KEYS}
    out.update(params=[dict(p) for p in r.params], epsilon_target=list(r.epsilon_target), after=list(r.after),
               prior_lines=[list(p) for p in r.prior_lines])
    return out


def _transcripts_of(certificate: Mapping[str, Any]) -> dict[str, Any]:
    """The replay's registration of each transcript, from the certificate (the private split by its sha256 and
    size); a certificate without the whole registration (exported before the lines were held to their configuration)
    is a one-line error: re-export the bundle."""
    from pipeline.privacy.replay import Registered

    out = {}
    for name, t in certificate["transcripts"].items():
        missing = [k for k in REGISTRATION_KEYS if k not in t]
        if missing:
            raise BundleError(f"certificate: transcript {name} lacks its registration's {', '.join(missing)} (a "
                                f"bundle exported before its lines were held to the configuration): re-export it")
        out[name] = Registered(claims=int(t["claims"]), run=t["run"], experiment=certificate["experiment"],
                               stage=t["stage"], phase=str(t["phase"]), delta=float(t["delta"]),
                               data_sha256=t["data_sha256"], data_n=t["data_n"],
                               configuration=bool(t["configuration"]), params=tuple(t["params"]),
                               epsilon_target=tuple(t["epsilon_target"]), after=tuple(t["after"]),
                               rtol=float(t["rtol"]), prior_lines=tuple(tuple(p) for p in t["prior_lines"]))
    return out


def _replay(root: Path, registered: Mapping[str, Any]) -> dict[str, Any]:
    """Replay the bundle's transcripts against their registration (raises ReplayError); the verdict, paths relative."""
    from pipeline.privacy.replay import audit

    paths = {name: root / "ledger" / f"{name}.jsonl" for name in registered}
    claims, summaries = audit(paths, registered)
    for c in (*claims, *summaries):
        c["transcript"] = Path(c["transcript"]).relative_to(root).as_posix()
    return {"format": "dpgen-replay/3", "all_ok": True, "n_claims": len(claims), "transcripts": summaries,
            "claims": claims}


def _privacy(root: Path, names: list[str]) -> dict[str, Any]:
    from pipeline.results.all_runs import run_privacy

    return run_privacy([root / "ledger" / f"{name}.jsonl" for name in names])


def _lines(root: Path, names: list[str]) -> list[Any]:
    from pipeline.privacy import ledger

    return [e for name in names for _, e in ledger.read_ledger(root / "ledger" / f"{name}.jsonl")]


def check_model_binding(meta: Mapping[str, Any], certificate: Mapping[str, Any], lines: list[Any]) -> None:
    """The weights' training metadata belongs to the certified lines: a private model, the lines' seed, the run
    (STRAIGHTDP records it) and private split (DPDM records it), an eps within the certified one."""
    name = f"{certificate['method']}/{certificate['run']}"
    if meta.get("private") is not True:
        raise BundleError(f"bundle {name}: the weights' training metadata does not say private: true")
    seeds = {int(e.seed) for e in lines}
    if "seed" in meta and seeds != {int(meta["seed"])}:
        raise BundleError(f"bundle {name}: the weights were trained with seed {meta['seed']}, the lines name "
                          f"{sorted(seeds)}")
    if "run" in meta and meta["run"] != certificate["ledger_run"]:
        raise BundleError(f"bundle {name}: the weights are run {meta['run']!r}, the lines "
                          f"{certificate['ledger_run']!r}")
    if "data_sha256" in meta and meta["data_sha256"] != certificate["data_sha256"]:
        raise BundleError(f"bundle {name}: the weights were trained on data {meta['data_sha256'][:12]}..., the "
                          f"certificate names {str(certificate['data_sha256'])[:12]}...")
    eps = meta.get("epsilon")
    # the training stage recorded its own claim (fast accountant); the certificate's is the reference recompute of
    # the same lines: equal up to the accountants' discretisation, far apart for weights of another eps's run
    if eps is not None and not math.isclose(float(eps), float(certificate["epsilon"]), rel_tol=META_EPS_RTOL):
        raise BundleError(f"bundle {name}: the weights were trained for eps {float(eps):.6g}, the lines certify "
                          f"{float(certificate['epsilon']):.6g}")


def _grid_png(split: Split, png: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    from pipeline.reporting.figures import sample_grid_figure

    fig = sample_grid_figure({title: split}, per_class=8)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def _test_metrics(metrics_json: Path) -> dict[str, float]:
    """The test-split metrics a card reports: evaluate_samples' keys that all_runs.parquet copies, where finite."""
    from pipeline.results.all_runs import METRICS

    m = read_json(metrics_json)
    return {k: float(m[k]) for k in METRICS if m.get(k) is not None and math.isfinite(float(m[k]))}


#: where each file a sampler reads goes in a bundle (rule export_bundle's input -> path), and what the card says of it
CONTENTS = {"model": ("weights/", "the trained network's weights (safetensors)"),
            "moments": ("release/moments.npz", "the noisy class moments the run released (Stage 1)"),
            "public_flow": ("public/flow/", "the public flow the release's guidance steers (public data, not covered "
                                            "by the eps)"),
            "autoencoder": ("public/autoencoder/", "the public autoencoder that decodes the latent codes (public "
                                                   "data, not covered by the eps)")}


def _export_parts(inputs: Mapping[str, Path], root: Path) -> list[dict[str, Any]]:
    """Write what the run's sampler reads beside the weights (:data:`CONTENTS`); each part's description."""
    if "moments" in inputs:
        from pipeline.privacy.moments import ReleasedMoments

        ReleasedMoments.load(inputs["moments"])  # refuses a foreign or pickled file before it is shipped
        (root / "release").mkdir()
        shutil.copyfile(inputs["moments"], root / CONTENTS["moments"][0])
    if "public_flow" in inputs:
        from pipeline.bundles.weights import export_weights

        export_weights(inputs["public_flow"], root / CONTENTS["public_flow"][0])
    if "autoencoder" in inputs:
        from pipeline.bundles.weights import export_autoencoder

        export_autoencoder(inputs["autoencoder"], root / CONTENTS["autoencoder"][0])
    return [{"path": path, "what": what} for name, (path, what) in CONTENTS.items() if name in inputs]


@stage("export_bundle", inputs=("samples", "metrics"), optional_inputs=tuple(CONTENTS), outputs=("bundle",),
       any_inputs=True,
       params={"method": "the method", "run": "the run's name (the bundle's folder)",
               "experiment": "the experiment every ledger line names",
               "kind": "model (weights or what else the sampler reads + how it samples) or synthetic (the synthetic "
                       "set is the private output)",
               "dataset": "the private data's name (the card's datasets)",
               "epsilon_target": "the eps the run was calibrated to",
               "expected": "transcript name -> {claims, run, stage, delta, data, configuration}: the method's "
                           "registration (pipeline.registry.TranscriptSpec); its --in is ledger_<name>",
               "sampling": "kind model: how the run sampled (the sampler, steps, guidance, batch size, seed, n)",
               "covers": "what the eps covers (sentences)", "not_covered": "what it does not cover (sentences)"})
def export_bundle(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Write a private run's bundle (weights or synthetic set, transcripts, replay verdict, certificate, card);
    refuses a run whose transcripts do not replay or whose weights do not belong to them."""
    from pipeline.bundles import card as cards
    from pipeline.reporting.review import code_commit

    kind = params.get("kind")
    if kind not in KINDS:
        raise PipelineError(f"stage export_bundle: params.kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if (kind == "model") != any(name in inputs for name in CONTENTS):
        raise PipelineError(f"stage export_bundle: a model bundle needs one of --in {'=, '.join(CONTENTS)}=..., a "
                            f"synthetic one takes none")
    expected = dict(params.get("expected") or {})
    if not expected:
        raise PipelineError("stage export_bundle: params.expected names no transcript (a private run has one)")
    missing = [n for n in expected if f"ledger_{n}" not in inputs]
    if missing:
        raise PipelineError(f"stage export_bundle: transcript {missing[0]} needs --in ledger_{missing[0]}=...")
    from pipeline.privacy.replay import registered_from_params

    experiment = str(params["experiment"])
    registered = registered_from_params(expected, experiment)
    out = Path(outputs["bundle"])
    out.parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (root / "ledger").mkdir()
        for name in expected:
            shutil.copyfile(inputs[f"ledger_{name}"], root / "ledger" / f"{name}.jsonl")
        verdict = _replay(root, registered)
        (root / "replay.json").write_text(json.dumps(verdict, indent=1, sort_keys=True) + "\n")
        names = list(expected)
        lines = _lines(root, names)
        privacy = _privacy(root, names)
        runs = sorted({r.run for r in registered.values()})
        shas = sorted({r.data_sha256 for r in registered.values() if r.data_sha256})
        certificate: dict[str, Any] = {
            "format": BUNDLE_FORMAT, "method": str(params["method"]), "run": str(params["run"]),
            "ledger_run": runs[0] if len(runs) == 1 else runs, "experiment": experiment, "kind": kind,
            "dataset": str(params.get("dataset", "")), "epsilon": float(privacy["eps_certified"]),
            "epsilon_target": params.get("epsilon_target"), "delta": float(privacy["delta"]),
            "accountant": privacy["accountant"], "adjacency": privacy["adjacency"],
            "mechanisms": privacy["mechanisms"], "data_sha256": shas[0] if len(shas) == 1 else shas,
            "transcripts": {n: _registration(r) for n, r in registered.items()},
            "code_version": code_commit(),
            "code_version_note": "the commit that exported the bundle; the training job ran earlier, from the "
                                 "code its Snakemake run had (Snakemake reruns a job whose code changed)",
            "covers": list(params.get("covers") or []), "not_covered": list(params.get("not_covered") or [])}
        weights: dict[str, Any] = {}
        if "model" in inputs:
            from pipeline.bundles.weights import export_weights  # torch: a synthetic set's export never imports it

            weights = export_weights(inputs["model"], root / "weights")
            check_model_binding(weights["meta"], certificate, lines)
        if kind == "model":
            certificate["contents"] = _export_parts(inputs, root)
            # the card's library: diffusers where a diffusers model ships (not DP-MERF's generator, not a release)
            certificate["library_name"] = "diffusers" if weights.get("diffusers") or "public_flow" in inputs else None
            (root / "sampling.json").write_text(json.dumps(dict(params.get("sampling") or {}), indent=1,
                                                           sort_keys=True) + "\n")
        from pipeline.io import load_split, save_split

        # checked against the run's manifest; the bundle's own (samples.json, what load_split reads) names no path
        # or training fact of the run
        split = load_split(inputs["samples"])
        save_split(root / SAMPLES, split, name=f"{params['method']}/{params['run']}", source="export_bundle",
                   seed=int(lines[0].seed))
        _grid_png(split, root / "samples.png", f"{params['method']} {params['run']}")
        metrics = _test_metrics(inputs["metrics"])
        (root / "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True) + "\n")
        (root / CARD).write_text(cards.render(certificate, metrics))
        certificate["files"] = file_hashes(root)
        (root / CERTIFICATE).write_text(json.dumps(certificate, indent=1, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(root, out)
    finally:
        if root.exists():
            shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- verify

def read_certificate(path: str | Path) -> dict[str, Any]:
    root = Path(path)
    file = root / CERTIFICATE
    if not file.is_file():
        raise BundleError(f"{root}: no {CERTIFICATE} (not a bundle folder)")
    try:
        certificate = json.loads(file.read_text())
    except ValueError as exc:
        raise BundleError(f"{file}: not JSON ({exc})") from None
    if not isinstance(certificate, dict) or certificate.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{file}: not a {BUNDLE_FORMAT} certificate")
    return certificate


def verify(path: str | Path) -> dict[str, Any]:
    """Check a bundle end to end (see the module docstring); its certificate, or :class:`BundleError` in one line."""
    from pipeline.bundles import card as cards
    from pipeline.privacy.replay import ReplayError

    root = Path(path)
    certificate = read_certificate(root)
    listed = certificate.get("files") or {}
    present = file_hashes(root)
    missing, added = sorted(set(listed) - set(present)), sorted(set(present) - set(listed))
    if missing:
        raise BundleError(f"{root}: {missing[0]} is missing (the certificate lists it)")
    if added:
        raise BundleError(f"{root}: {added[0]} is not in the certificate (added after export)")
    altered = [rel for rel, sha in sorted(listed.items()) if present[rel] != sha]
    if altered:
        raise BundleError(f"{root}: {altered[0]} differs from the certificate's sha256 (altered after export)")
    cards.check(root / CARD, certificate)
    try:
        _replay(root, _transcripts_of(certificate))
    except ReplayError as exc:
        raise BundleError(f"{root}: {exc}") from None
    names = list(certificate["transcripts"])
    privacy = _privacy(root, names)
    if privacy["eps_certified"] > float(certificate["epsilon"]) * (1 + EPS_RTOL):
        raise BundleError(f"{root}: the transcripts certify eps {privacy['eps_certified']:.6g}, the certificate "
                          f"states {certificate['epsilon']:.6g}")
    if privacy["delta"] != float(certificate["delta"]) or privacy["accountant"] != certificate["accountant"]:
        raise BundleError(f"{root}: the transcripts' delta/accountant ({privacy['delta']}, {privacy['accountant']}) "
                          f"are not the certificate's")
    if (root / "weights").is_dir():
        from pipeline.bundles.weights import weights_meta

        check_model_binding(weights_meta(root / "weights"), certificate, _lines(root, names))
    return certificate
