"""The evaluation core's wiring (``rules/evaluate.smk``): the evaluation network, the CLIP file every evaluation
reads, and the params of an evaluate job.

Not a method (the leading underscore keeps :func:`pipeline.plugins.method_names` from listing it): every method's
samples are scored by the same ``evaluate_samples`` call, so each method's rule file wires its evaluate rule with
this object's paths and params. Nothing here imports Snakemake.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.wiring import House, params_json, stage_params


class Wiring:
    """Paths and params of the evaluation core for one :class:`House`."""

    def __init__(self, house: House) -> None:
        self.house = house

    @property
    def evalnet(self) -> Path:
        """The evaluation network's folder (rule train_evalnet: evalnet.pt, metrics.json)."""
        return self.house.layout.expdir / "evalnet"

    @property
    def evalnet_model(self) -> Path:
        """The evaluation classifier every evaluate rule reads (and EMPDEN's diagnostics, Tables 1/5/6, Figure 6a)."""
        return self.evalnet / "evalnet.pt"

    @property
    def clip_dir(self) -> Path:
        """The CLIP model's folder (rule train_clip or import_clip: clip.pt, metrics.json)."""
        return self.house.layout.expdir / "clip"

    @property
    def clip_model(self) -> Path:
        return self.clip_dir / "clip.pt"

    @property
    def trains_clip(self) -> bool:
        """Whether the CLIP model is trained on the public split (rule train_clip) or imported (rule import_clip)."""
        return self.house.config["evaluation"]["clip"]["source"] == "trained"

    def clip_inputs(self, wildcards: Any = None) -> dict[str, Path]:
        """The CLIP file an evaluation reads, when evaluation.clip.enabled (unpacked into each evaluate rule)."""
        return {"clip": self.clip_model} if self.house.config["evaluation"]["clip"]["enabled"] else {}

    @staticmethod
    def clip_arg(wildcards: Any, input: Mapping[str, Any]) -> str:  # noqa: A002 - Snakemake passes it by this name
        """' clip=<path>' for the evaluate_samples call, or nothing when CLIP metrics are off."""
        return f" clip={shlex.quote(str(input['clip']))}" if "clip" in input.keys() else ""

    def params(self) -> dict[str, Any]:
        """The evaluation section an evaluate job depends on (the CLIP training keys reach it through the CLIP file)."""
        ev = dict(self.house.config["evaluation"])
        ev["clip"] = {"enabled": ev["clip"]["enabled"]}
        return ev

    def evaluate_params(self, name: str) -> str:
        """Params of one evaluate_samples job scoring the samples ``name`` (e.g. ``empden/hybrid/p50_B100_T3_beta1_s0``,
        ``reference_real``): the evaluation section, the seed, device and threads. No config id: the metrics file
        names its samples, and every method's evaluation reads the same settings."""
        h = self.house
        return params_json(evaluation=self.params(), seed=h.config["seed"], device=h.config["device"],
                           threads=h.torch_threads, name=name)

    def features_params(self) -> str:
        """Params of one extract_features job (a shard's samples' features, ``sampling.shards``): the evaluation
        section, device and threads."""
        h = self.house
        return params_json(evaluation=self.params(), device=h.config["device"], threads=h.torch_threads)

    def evalnet_params(self) -> str:
        """Params of rule train_evalnet: the evalnet section, seed and device."""
        h = self.house
        return params_json(evalnet=h.config["evaluation"]["evalnet"], seed=h.config["seed"], device=h.config["device"])

    def clip_params(self) -> str:
        """Params of the CLIP rule: the clip section without ``enabled`` (which only decides whether evaluations read
        it); training also depends on the seed and threads, importing does not."""
        clip = {k: v for k, v in self.house.config["evaluation"]["clip"].items() if k != "enabled"}
        if self.trains_clip:
            return stage_params(clip=clip, seed=self.house.config["seed"], threads=self.house.torch_threads)
        return stage_params(clip=clip)

    @property
    def reference_real_metrics(self) -> Path:
        """The 'real data' reference row's metrics (rule evaluate_reference_real; reference_real.parquet)."""
        return self.house.layout.expdir / "eval" / "reference_real" / "metrics.json"
