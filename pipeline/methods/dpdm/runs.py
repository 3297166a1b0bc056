"""DPDM training runs as values: which runs the config's tables need, and the name of each.

A *run* is one DP-SGD training of a diffusion denoiser (Dockhorn et al. 2023, DPDM): its
diffusion configuration (parameterisation: EDM, v-prediction, VP or VE, DPDM App. C), its
target epsilon, its noise multiplicity K (DPDM Sec. 4, eq. 6: K noise levels per example
and gradient) and its training seed. A run is one target path; its name is the path token
``<param>_eps<eps>_K<K>_seed<seed>``, e.g. ``edm_eps0p2_K4_seed0`` (numbers without dots: 0.2
is ``0p2``), so any run, not only those the tables use, can be asked for by path.
:class:`DpdmRun` declares the grammar (:data:`RUN_NAME`, in the shared run-name grammar of
:mod:`pipeline.runs`): :attr:`DpdmRun.name` writes it, :meth:`DpdmRun.from_name` reads it back and
:data:`RUN_PATTERN` is the Snakemake wildcard constraint.

The table row builders (:func:`main_rows` and the three ablations) turn the ``dpdm`` config
section into the rows each table rule reports. Pure Python (no torch): ``rules/dpdm.smk``
imports it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.config import ConfigError, schema_defaults
from pipeline.runs import NamedRun, RunGrammar, choice, integer, number
# numbers as path tokens, re-exported from the shared grammar for the rule files that import them from here
from pipeline.runs import fmt_num as fmt_num
from pipeline.runs import parse_num as parse_num

#: DPDM App. C's diffusion configurations
PARAMETERISATIONS = ("edm", "vpred", "vp", "ve")

#: the run grammar: ``<param>_eps<eps>_K<K>_seed<seed>``
RUN_NAME = RunGrammar("DPDM run", (choice("parameterisation", PARAMETERISATIONS, label="param"),
                                   number("epsilon", "eps"), integer("K", "K"), integer("seed", "seed")),
                      example="edm_eps0p2_K4_seed0")
#: the run grammar as a Snakemake wildcard constraint (no groups of its own)
RUN_PATTERN = RUN_NAME.pattern

#: one table row: the run it reports, the sampler and the columns the table stage copies
Row = dict[str, Any]

@dataclass(frozen=True, order=True)
class DpdmRun(NamedRun):
    """One DPDM training run: diffusion configuration, target epsilon, noise multiplicity K, seed.

    Its name is the path token ``edm_eps0p2_K4_seed0`` (:attr:`name`; :meth:`from_name` reads it back)."""

    GRAMMAR = RUN_NAME

    parameterisation: str
    epsilon: float
    K: int
    seed: int

    def __post_init__(self) -> None:
        if self.parameterisation not in PARAMETERISATIONS:
            raise ValueError(f"DPDM parameterisation must be one of {', '.join(PARAMETERISATIONS)}, "
                             f"got {self.parameterisation!r}")
        # normalise the types, so DpdmRun("edm", 1, 4, 0) == DpdmRun.from_name("edm_eps1_K4_seed0")
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "K", int(self.K))
        object.__setattr__(self, "seed", int(self.seed))


#: the downstream classifiers DPDM's task-specific DP-SGD baseline trains (pipeline.methods.dpdm.dpsgd_classifier.KINDS)
CLASSIFIERS = ("cnn", "logreg")
#: the task-specific DP-SGD classifier's run grammar: ``<classifier>_eps<eps>_seed<seed>``
CLASSIFIER_RUN_NAME = RunGrammar("DP-SGD classifier run", (choice("classifier", CLASSIFIERS),
                                                           number("epsilon", "eps"), integer("seed", "seed")),
                                 example="cnn_eps0p2_seed0")
CLASSIFIER_RUN_PATTERN = CLASSIFIER_RUN_NAME.pattern


@dataclass(frozen=True, order=True)
class ClassifierRun(NamedRun):
    """One task-specific DP-SGD classifier run (DPDM Sec. 5's comparison): classifier, target epsilon, seed.

    Its name is the path token ``cnn_eps0p2_seed0`` (:attr:`name`; :meth:`from_name` reads it back)."""

    GRAMMAR = CLASSIFIER_RUN_NAME

    classifier: str
    epsilon: float
    seed: int

    def __post_init__(self) -> None:
        if self.classifier not in CLASSIFIERS:
            raise ValueError(f"DP-SGD classifier must be one of {', '.join(CLASSIFIERS)}, got {self.classifier!r}")
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "seed", int(self.seed))


def subsection(dpdm: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """``dpdm[key]`` (a nullable section: ``gradient_variance``, ``dpsgd_classifier``) with the schema's defaults
    under the keys it leaves out (the config's validation fills no nullable section), or None when it is null."""
    value = dpdm.get(key, {})
    return None if value is None else {**schema_defaults("dpdm", key), **value}


def classifier_runs(dpdm: Mapping[str, Any]) -> list[ClassifierRun]:
    """The task-specific DP-SGD classifier runs: every classifier of ``dpdm.dpsgd_classifier`` at DPDM's epsilons and
    seeds; none when the section is null or DPDM is unconditional (``class_conditional: false``: its samples carry no
    labels, so there is no synthetic-data classifier to compare with; DPDM's comparison has six labelled setups,
    MNIST and Fashion-MNIST at three eps)."""
    section = subsection(dpdm, "dpsgd_classifier")
    if section is None or not dpdm.get("class_conditional", True):
        return []
    return [ClassifierRun(c, e, s) for c in section["classifiers"] for e in dpdm["epsilons"] for s in dpdm["seeds"]]


def parameterisation_at(dpdm: Mapping[str, Any], eps: float) -> str:
    """The main table's configuration at ``eps``: ``dpdm.parameterisation_by_epsilon``, else ``dpdm.parameterisation``."""
    for key, value in dpdm["parameterisation_by_epsilon"].items():
        if float(key) == float(eps):
            return value
    return dpdm["parameterisation"]


def main_run(dpdm: Mapping[str, Any], eps: float, seed: int | None = None, K: int | None = None) -> DpdmRun:
    """The main table's run at ``eps`` (first seed and ``dpdm.K`` unless given)."""
    return DpdmRun(parameterisation_at(dpdm, eps), eps, dpdm["K"] if K is None else K,
                   dpdm["seeds"][0] if seed is None else seed)


def init_of(dpdm: Mapping[str, Any], parameterisation: str) -> str:
    """Where a run of ``parameterisation`` starts: "public" or "scratch".

    The public denoiser is EDM-preconditioned, and its weights compute a different function
    under another preconditioner, so only EDM runs start from it (when ``dpdm.init`` is public).
    """
    return "public" if dpdm["init"] == "public" and parameterisation == "edm" else "scratch"


def sampler_settings(dpdm: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The settings of the sampler ``name`` of ``dpdm.sampling.samplers`` (a one-line ConfigError when absent)."""
    samplers = dpdm["sampling"]["samplers"]
    if name not in samplers:
        raise ConfigError(f"config error at dpdm.sampling: no sampler named {name!r} (have: {', '.join(samplers)})")
    return samplers[name]


#: ``dpdm.sampling.main`` value: the main sampler is chosen on the validation split (rule dpdm_select_sampler)
AUTO = "auto"
#: the validation metric the choice maximises: downstream CNN accuracy on ``val`` (DPDM App. F.4.3
#: searches samplers for downstream accuracy); ``test`` never enters the choice
SELECT_BY = "acc_cnn_val"


def check_sampler_names(dpdm: Mapping[str, Any]) -> None:
    """Every sampler the tables use exists (one line instead of a KeyError mid-DAG)."""
    if dpdm["sampling"]["main"] == AUTO:
        if not dpdm["sampler_ablation"]:
            raise ConfigError("config error at dpdm.sampling.main: 'auto' chooses among dpdm.sampler_ablation."
                              "samplers, which is null; name a sampler of dpdm.sampling.samplers or set the ablation")
    else:
        sampler_settings(dpdm, dpdm["sampling"]["main"])
    for s in (dpdm["sampler_ablation"] or {}).get("samplers", []):
        sampler_settings(dpdm, s)


def with_main_sampler(dpdm: Mapping[str, Any], sampler: str) -> dict[str, Any]:
    """``dpdm`` with the main sampler ``auto`` replaced by the sampler the validation split chose."""
    sampling = {**dpdm["sampling"], "main": sampler, "chosen_on": "val"}
    return {**dpdm, "sampling": sampling}


def mean_scores(scores: Mapping[str, list[float]]) -> dict[str, float]:
    """Each sampler's mean validation score."""
    if not scores or any(not v for v in scores.values()):
        raise ValueError("select_sampler: every candidate sampler needs at least one validation score")
    return {k: sum(v) / len(v) for k, v in scores.items()}


def select_sampler(scores: Mapping[str, list[float]]) -> str:
    """The sampler with the largest mean validation score (ties: the first in ``scores``' order, as ``max`` keeps)."""
    means = mean_scores(scores)
    return max(means, key=means.__getitem__)


def _row(row: str, run: DpdmRun, dpdm: Mapping[str, Any], sampler: str, **extra: Any) -> Row:
    return {"row": row, "run": run.name, "eps_target": run.epsilon, "parameterisation": run.parameterisation,
            "K": run.K, "sampler": sampler, "seed": run.seed, **extra, "init": init_of(dpdm, run.parameterisation)}


def _main_sampler(dpdm: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """The main sampler and the column that says what chose it: the config, or the validation split."""
    sampling = dpdm["sampling"]
    return sampling["main"], {"sampler_chosen_on": sampling.get("chosen_on", "config")}


def main_rows(dpdm: Mapping[str, Any]) -> list[Row]:
    """Rows of dpdm_table_main (DPDM Table 1): every epsilon x seed with the main sampler."""
    sampler, chosen = _main_sampler(dpdm)
    runs = [main_run(dpdm, e, s) for e in dpdm["epsilons"] for s in dpdm["seeds"]]
    return [_row(f"{r.name}_{sampler}", r, dpdm, sampler, **chosen) for r in runs]


def noise_multiplicity_rows(dpdm: Mapping[str, Any]) -> list[Row]:
    """Rows of dpdm_table_noise_multiplicity (DPDM Table 4): one run per K at one epsilon (main sampler, first seed)."""
    ab = dpdm["noise_multiplicity"]
    (sampler, chosen), seed = _main_sampler(dpdm), dpdm["seeds"][0]
    return [_row(f"K{k}", main_run(dpdm, ab["epsilon"], seed, k), dpdm, sampler, **chosen) for k in ab["K"]]


def sampler_rows(dpdm: Mapping[str, Any]) -> list[Row]:
    """Rows of dpdm_table_samplers (DPDM Table 5): each listed epsilon's main run under every listed sampler."""
    ab = dpdm["sampler_ablation"]
    seed = dpdm["seeds"][0]
    return [_row(f"{s}_eps{fmt_num(e)}", main_run(dpdm, e, seed), dpdm, s,
                 sampler_settings=json.dumps(sampler_settings(dpdm, s), sort_keys=True))
            for e in ab["epsilons"] for s in ab["samplers"]]


def configuration_rows(dpdm: Mapping[str, Any]) -> list[Row]:
    """Rows of dpdm_table_configurations (DPDM App. C, Table 3): one run per configuration at one epsilon."""
    ab = dpdm["parameterisation_ablation"]
    (sampler, chosen), seed = _main_sampler(dpdm), dpdm["seeds"][0]
    return [_row(p, DpdmRun(p, ab["epsilon"], dpdm["K"], seed), dpdm, sampler, **chosen)
            for p in ab["parameterisations"]]


#: table -> its row builder, and the ``dpdm`` key that switches the table on (None: always built)
TABLES: dict[str, tuple[Callable[[Mapping[str, Any]], list[Row]], str | None]] = {
    "dpdm_table_main": (main_rows, None),
    "dpdm_table_noise_multiplicity": (noise_multiplicity_rows, "noise_multiplicity"),
    "dpdm_table_samplers": (sampler_rows, "sampler_ablation"),
    "dpdm_table_configurations": (configuration_rows, "parameterisation_ablation"),
}


def table_rows(dpdm: Mapping[str, Any]) -> dict[str, list[Row]]:
    """Table name -> rows, for every DPDM table the section asks for (the main table always)."""
    return {table: build(dpdm) for table, (build, key) in TABLES.items() if key is None or dpdm[key]}


def runs(dpdm: Mapping[str, Any]) -> list[DpdmRun]:
    """Every training run the enabled tables need, each once, sorted by name."""
    names = {r["run"] for rows in table_rows(dpdm).values() for r in rows}
    return [DpdmRun.from_name(n) for n in sorted(names)]
