"""The audits' wiring (``rules/audit.smk``): which ledger transcripts the one-run canary audit reads, which models
the membership attacks score, DPDM's non-private twin, and their targets.

Plain Python over one :class:`~pipeline.wiring.House` (no Snakemake): ``tests/methods/audit/test_wiring.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pipeline.resources as cost
from pipeline.plugins import audited_methods
from pipeline.methods.audit import costs
from pipeline.methods.dpdm.wiring import Wiring as DpdmWiring
from pipeline.methods.straightdp.wiring import Wiring as StraightdpWiring
from pipeline.registry import TranscriptSpec
from pipeline.methods.straightdp import runs as straightdp_runs
from pipeline.methods.dpdm.runs import main_run
from pipeline.wiring import House, stage_params

#: the held-out real split whose records play the non-members (never trained on, nothing chosen from it)
MIA_NONMEMBERS = "reference"
#: the methods whose trained models the membership attacks score (DPDM's twin comes with DPDM)
MIA_METHODS = ("dpdm", "straightdp")
#: the accounting keys of the noise grid SecMI's stopping points sit on (EMPDEN Table 13)
MIA_GRID_KEYS = ("sigma_min", "sigma_max", "rho", "asr_N")
#: a twin's run name (one twin per DPDM seed)
TWIN_RUN = re.compile(r"twin_seed([0-9]+)")

#: the chosen methods' transcripts (the house's registry, :meth:`pipeline.registry.MethodRegistry.transcripts`
#: over the chosen methods of a list)
Transcripts = Callable[[Sequence[str]], Mapping[Path, TranscriptSpec]]


class Wiring:
    """The one-run audit (Steinke, Nasr & Jagielski 2023) and membership inference of one configuration.

    ``transcripts`` gives the registered transcripts of a list of methods (in the rule files, the house's registry);
    the audit reads those of the chosen methods that declare ``METHOD.audited``.
    """

    def __init__(self, house: House, transcripts: Transcripts, dpdm: DpdmWiring | None = None,
                 straightdp: StraightdpWiring | None = None) -> None:
        self.house = house
        self._transcripts = transcripts
        self.dpdm = dpdm or DpdmWiring(house)
        self.straightdp = straightdp or StraightdpWiring(house)

    @property
    def section(self) -> dict[str, Any]:
        return self.house.config["audit"]

    @property
    def chosen(self) -> list[str]:
        return list(self.house.config["methods"])

    # ---------------------------------------------------------------- the one-run audit

    @property
    def table(self) -> Path:
        """audit_one_run.parquet: eps_lb per audited ledger line beside its claim."""
        return self.house.layout.tables / "audit_one_run.parquet"

    @property
    def audited_methods(self) -> list[str]:
        """The chosen methods whose transcripts the one-run audit reruns (those declaring METHOD.audited)."""
        return [m for m in audited_methods() if m in self.chosen]

    def audited_claims(self) -> dict[Path, TranscriptSpec]:
        """Transcript -> its spec, of the chosen audited methods (the stage picks the lines it can audit)."""
        return dict(self._transcripts(self.audited_methods))

    def empden_claims(self) -> dict[Path, TranscriptSpec]:
        """Transcript -> its spec, of EMPDEN's sampler runs when chosen (their audit costs most per line)."""
        return dict(self._transcripts(["empden"] if "empden" in self.chosen else []))

    def audited_transcripts(self) -> dict[str, Path]:
        """Transcript stem -> path: the audit job's named inputs."""
        return {Path(p).stem: Path(p) for p in self.audited_claims()}

    def one_run_params(self) -> str:
        h = self.house
        return stage_params(audit=self.section, seed=h.seed, threads=h.torch_threads)

    def one_run_runtime_min(self) -> int:
        """The audit job's SLURM minutes, from how many lines it reruns (EMPDEN's cost most)."""
        return costs.one_run_runtime_min(self.house.config, sum(s.claims for s in self.audited_claims().values()),
                                         sum(s.claims for s in self.empden_claims().values()))

    # ---------------------------------------------------------------- membership inference

    @property
    def mia_table(self) -> Path:
        """audit_mia.parquet: AUC, TPR at low FPR, ASR and eps_refutable per model and attack."""
        return self.house.layout.tables / "audit_mia.parquet"

    @property
    def table13(self) -> Path:
        """EMPDEN Table 13: its theoretical ASR bound beside SecMI on the non-private twin."""
        return self.house.layout.tables / "empden_table13.parquet"

    @property
    def nonmembers(self) -> Path:
        """The split whose records play the non-members (:data:`MIA_NONMEMBERS`)."""
        return self.house.layout.split(MIA_NONMEMBERS)

    def mia_metrics_path(self, method: str, run: str) -> Path:
        """One model's attack metrics (rule audit_mia)."""
        return self.house.layout.expdir / "audit" / "mia" / method / f"{run}.json"

    def twin_model_path(self, seed: int | str) -> Path:
        """DPDM's non-private twin of one seed: the attacks' positive control (never release it)."""
        return self.house.layout.expdir / "models" / "dpdm" / f"twin_seed{seed}.pt"

    def twin_metrics(self, seed: int | str) -> Path:
        return self.house.layout.expdir / "train" / "dpdm_twin" / f"twin_seed{seed}.json"

    def mia_models(self) -> list[tuple[str, str]]:
        """(method, run) of every model the membership attacks score, for the chosen methods: DPDM's main runs and
        a twin per seed, STRAIGHTDP's Table 1 runs that train a flow with a plan."""
        models = []
        if "dpdm" in self.chosen:
            d = self.dpdm.section
            models += [("dpdm", main_run(d, eps, seed).name) for eps in d["epsilons"] for seed in d["seeds"]]
            models += [("dpdm_twin", f"twin_seed{seed}") for seed in d["seeds"]]
        if "straightdp" in self.chosen:
            models += [("straightdp", r.name) for r in self.straightdp.runs() if r.row in straightdp_runs.PLANS]
        return models

    def mia_model_input(self, wildcards: Any) -> Path:
        """The model file audit_mia attacks: a DPDM or STRAIGHTDP run's, or a twin's (``twin_seed<seed>``)."""
        if wildcards.method == "dpdm":
            return self.dpdm.model_path(wildcards.run)
        if wildcards.method == "straightdp":
            return self.straightdp.model_path(wildcards.run)
        m = TWIN_RUN.fullmatch(wildcards.run)
        if m is None:
            raise ValueError(f"audit_mia: a dpdm_twin run is named twin_seed<seed>, got {wildcards.run!r}")
        return self.twin_model_path(int(m[1]))

    def mia_table_inputs(self) -> dict[str, Path]:
        """<method>__<run> -> metrics of every attacked model: the inputs of audit_mia_table."""
        return {f"{method}__{run}": self.mia_metrics_path(method, run) for method, run in self.mia_models()}

    def mia_targets(self) -> list[Path]:
        """audit_mia.parquet when a method with trained models is chosen; Table 13 too when DPDM (the twin) and the
        accounting tables (its theoretical column) are."""
        if not any(m in self.chosen for m in MIA_METHODS):
            return []
        targets = [self.mia_table]
        if "dpdm" in self.chosen and "accounting" in self.chosen:
            targets.append(self.table13)
        return targets

    def mia_attack_settings(self) -> dict[str, Any]:
        """audit.mia less the twin's keys: editing how the twin trains reruns the twin's attacks only."""
        return {k: v for k, v in self.section["mia"].items() if not k.startswith("twin_")}

    def mia_params(self, wildcards: Any) -> str:
        """audit_mia params of one model: the attack settings, Table 13's noise grid, the non-member split, and the
        delta at which eps_refutable is read (DPDM's: the twin's DP runs' claims)."""
        a, h = self.house.config["accounting"], self.house
        return stage_params(mia=self.mia_attack_settings(), grid={k: a[k] for k in MIA_GRID_KEYS},
                            method=wildcards.method, run=wildcards.run, nonmember_split=MIA_NONMEMBERS, seed=h.seed,
                            delta=self.dpdm.section["delta"], device=h.device, threads=h.torch_threads)

    def table_params(self) -> str:
        """audit_mia_table's and empden_table13's params: the seed."""
        return stage_params(seed=self.house.seed)

    @property
    def table13_twin(self) -> Path:
        """Table 13 reads the twin of DPDM's first seed."""
        return self.mia_metrics_path("dpdm_twin", f"twin_seed{self.dpdm.section['seeds'][0]}")

    # ---------------------------------------------------------------- the non-private twin

    def twin_inputs(self, wildcards: Any) -> dict[str, Path]:
        """The private split, the public denoiser when DPDM starts from it, and the non-members when the twin trains
        on the attacked members only (audit.mia.twin_train_on)."""
        layout = self.house.layout
        inputs = {"data": layout.split("private_train")}
        if self.dpdm.init_of(self.dpdm.section["parameterisation"]) == "public":
            inputs["init"] = layout.public_denoiser
        if self.section["mia"]["twin_train_on"] == "members":
            inputs["nonmembers"] = self.nonmembers
        return inputs

    def twin_params(self, wildcards: Any) -> str:
        """train_dpdm_twin params: DPDM's main recipe (dpdm section) without the mechanism, at audit.mia's twin_* keys
        (twin_members: how many of the attacked members it trains on, when it trains on members)."""
        d, m, h = self.dpdm.section, self.section["mia"], self.house
        keys = ("batch_size", "lr", "ema_decay", "label_dropout", "class_conditional", "unet", "checkpoint_every_s",
                "parameterisation")
        trainable = d["trainable"] if self.dpdm.init_of(d["parameterisation"]) == "public" else None
        members = {"members": m["twin_members"]} if m["twin_train_on"] == "members" else {}
        return stage_params(epochs=m["twin_epochs"], K=m["twin_K"], seed=int(wildcards.seed), member_seed=h.seed,
                            device=h.device, threads=h.torch_threads, trainable=trainable, **members,
                            **{k: d[k] for k in keys})

    @property
    def twin_runtime_min(self) -> int:
        """A twin's predicted minutes, whatever the time limit (its rule's ``retries``)."""
        return costs.twin_runtime_min(self.house.config)

    def resources(self, rule: str) -> dict[str, Any]:
        """What each job of ``rule`` (a rule of rules/audit.smk) asks the cluster for, its whole ``resources:``: its
        request in :data:`pipeline.methods.audit.costs.REQUESTS`."""
        return cost.resources(costs.REQUESTS, rule, self.house.config, self)

    # ---------------------------------------------------------------- targets

    def targets(self) -> list[Path]:
        """The one-run audit's table, and the membership tables :meth:`mia_targets` names."""
        return [self.table, *self.mia_targets()]

    def all_runs_inputs(self) -> dict[str, Path]:
        """The audits' tables all_runs joins in, when the audit method is chosen."""
        if "audit" not in self.chosen:
            return {}
        out = {"audit_one_run": self.table}
        if self.mia_table in self.mia_targets():
            out["audit_mia"] = self.mia_table
        return out
