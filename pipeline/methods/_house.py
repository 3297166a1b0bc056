"""The house's own outputs (``rules/common.smk``, ``rules/report.smk``, ``rules/review.smk``, the Snakefile's ``all``):
rule all's targets, the tables and figures of the index and the report with their captions and categories, the
transcripts the replay reads, and the rows of all_runs.parquet, from the core's outputs and what the chosen methods
registered.

Not a method (the leading underscore keeps :func:`pipeline.plugins.method_names` from listing it). Nothing here
imports Snakemake: ``tests/methods/test_house_outputs.py``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

from pipeline.config import config_id
from pipeline.plugins import report_categories
from pipeline.methods._evaluation import Wiring as EvaluationWiring
from pipeline.registry import MethodRegistry, RunRecord, TranscriptSpec
from pipeline.reporting.review import CAPTION_KEY
from pipeline.wiring import House, params_json, stage_params

#: the core's report categories (the number orders the menu); each method declares its own
#: (``pipeline/methods/<method>``: ``METHOD.report_category``)
CORE_REPORT_CATEGORIES = (("privacy_utility", "1 Comparison"), ("all_runs", "1 Comparison"),
                          ("reference_real", "2 Data and evaluation"), ("data_samples", "2 Data and evaluation"),
                          ("runtime", "9 Cost"))
#: where a table or figure goes whose name no category's prefix starts
OTHER_CATEGORY = "10 Other"
#: each method's headline row on the summary page: its configuration whose certified eps is nearest this
HEADLINE_EPSILON = 1.0


def shown_path(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it (``configs/mnist.yaml``), else as given."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def run_table_inputs(records: Sequence[RunRecord]) -> dict[str, str]:
    """metrics_i and ledger_i_j of each run record: the inputs of all_runs_table (and of a method's run table)."""
    out = {}
    for i, r in enumerate(records):
        out[f"metrics_{i}"] = r.metrics
        out.update({f"ledger_{i}_{j}": p for j, p in enumerate(r.ledgers)})
    return out


def run_table_params(records: Sequence[RunRecord]) -> str:
    """The records as a run table's params, their files aside (those are its inputs)."""
    runs = [{k: v for k, v in r.as_dict().items() if k not in ("metrics", "ledgers")} for r in records]
    return stage_params(runs=runs)


class Outputs:
    """What the house writes over every method, for one :class:`House` and the rule files' :class:`MethodRegistry`.

    ``captions``: the folder of the report's captions (``report/captions``, one reStructuredText file per table or
    figure).
    """

    def __init__(self, house: House, registry: MethodRegistry, captions: Path) -> None:
        self.house = house
        self.registry = registry
        self.captions = Path(captions)

    @property
    def chosen(self) -> list[str]:
        return list(self.house.config["methods"])

    def check_registered(self) -> None:
        """A chosen method no included rule file registers is a one-line ValueError (the Snakefile asks once every rule
        file is read, before any job)."""
        self.registry.check(self.chosen)

    # ---------------------------------------------------------------- the core's outputs

    @property
    def reference_metrics(self) -> Path:
        """The held-out real data's metrics against the real test split (the evaluation core's file)."""
        return EvaluationWiring(self.house).reference_real_metrics

    def core_runs(self) -> list[RunRecord]:
        """The reference rows every config has: held-out real data (no privacy)."""
        return [RunRecord(method="reference", config="reference_real", seed=self.house.seed, private=False,
                          metrics=self.reference_metrics, label="real held-out data")]

    @property
    def after_all(self) -> list[Path]:
        """The tables and figures made after every other job: the comparison (its cost columns come from the runtime
        table) and the runtime table of every job before them."""
        tables, figures = self.house.layout.tables, self.house.layout.figures
        return [figures / "privacy_utility.png", tables / "all_runs.parquet", tables / "runtime.parquet",
                figures / "runtime.png"]

    @property
    def core_report(self) -> list[Path]:
        """The core tables and figures every config reports, the comparison first."""
        layout = self.house.layout
        return [*self.after_all, layout.tables / "reference_real.parquet", layout.figures / "data_samples.png"]

    # ---------------------------------------------------------------- over the chosen methods

    def all_run_records(self) -> list[RunRecord]:
        """Every evaluated run of the core references and the chosen methods: all_runs.parquet's rows."""
        return [*self.core_runs(), *self.registry.runs(self.chosen)]

    def report_inputs(self) -> list[Path]:
        """Every table and figure (PNG; the PDF is written beside it) of the core and the chosen methods."""
        return [*self.core_report, *self.registry.report_targets(self.chosen)]

    def before_runtime(self) -> list[Path]:
        """What the runtime table waits for: every report input but those made after it, and the bundles ``all``
        exports (so their jobs' cost is in the table, and which rows it has does not depend on job order)."""
        from pipeline.bundles.wiring import Wiring as BundleWiring

        return [*(p for p in self.report_inputs() if p not in self.after_all),
                *BundleWiring(self.house, self.registry).targets()]

    def ledger_claims(self) -> dict[Path, TranscriptSpec]:
        """Ledger transcript -> its TranscriptSpec, of every chosen method: the replay's inputs."""
        return self.registry.transcripts(self.chosen)

    def ledger_transcripts(self) -> list[Path]:
        """Every ledger transcript the config produces."""
        return list(self.ledger_claims())

    def all_targets(self) -> list[Path]:
        """Every output of the target ``all``: data, tables, figures, the private runs' verified bundles, the ledger
        replay, the summary page and the report's table views. The public denoiser is built whenever a method that
        uses it is chosen."""
        from pipeline.bundles.wiring import Wiring as BundleWiring

        layout = self.house.layout
        return [*self.house.data_splits().values(), *self.core_report, *self.registry.targets(self.chosen),
                *BundleWiring(self.house, self.registry).targets(),
                layout.replay_report, layout.results / "index.html", layout.report_dir / "tables"]

    # ---------------------------------------------------------------- the report

    @cached_property
    def report_categories(self) -> tuple[tuple[str, str], ...]:
        """(name prefix, category) of the core and of every method declaring one, the core first; a table or
        figure goes to the first whose prefix its name has. Read once: every figure rule asks while the rule files
        are parsed."""
        return (*CORE_REPORT_CATEGORIES, *report_categories())

    def report_category(self, name: str) -> str:
        return next((cat for prefix, cat in self.report_categories if name.startswith(prefix)), OTHER_CATEGORY)

    @property
    def missing_caption(self) -> Path:
        """The caption of a table or figure nobody has written one for (a test keeps the default config free of it)."""
        return self.captions / "_missing.rst"

    def caption_path(self, name: str, kind: str) -> str:
        """``<captions>/<name>_<kind>.rst`` (where a table and a figure share a name), else ``<name>.rst``."""
        for candidate in (self.captions / f"{name}_{kind}.rst", self.captions / f"{name}.rst"):
            if candidate.is_file():
                return str(candidate)
        return str(self.missing_caption)

    def report_table_inputs(self) -> dict[str, Path]:
        """Table name -> Parquet path of every table of ``all``: each gets a readable view in the report (rule
        report_tables, ``results/report/tables/<name>.html``)."""
        return {p.stem: p for p in self.report_inputs() if p.suffix == ".parquet"}

    def report_view_inputs(self) -> dict[str, Path]:
        """rule report_tables' inputs: every table of ``all`` (name -> Parquet) and its caption
        (``caption_of_<name>`` -> its .rst), which its view shows above the table."""
        tables = self.report_table_inputs()
        return {**tables, **{f"{CAPTION_KEY}{name}": Path(self.caption_path(name, "table")) for name in tables}}

    def table_captions(self) -> dict[str, str]:
        """Table name -> its caption's text (report/captions/_table.rst shows it above each table view)."""
        return {name: Path(self.caption_path(name, "table")).read_text() for name in self.report_table_inputs()}

    def index_params(self, configfiles: Sequence[str | Path] = (), overrides: Sequence[str] = ()) -> str:
        """rule index_html's params: the summary page's title, the eps its headline rows are nearest to, and what
        was run (shown under the title): the configuration files in the order Snakemake merged them
        (``workflow.configfiles``), the top-level keys ``--config`` overrode, the id of the whole validated
        configuration and its seed."""
        config = dict(self.house.config)
        return params_json(title=f"DP generative models: {config['experiment']}", headline_epsilon=HEADLINE_EPSILON,
                           run={"configfiles": [shown_path(p) for p in configfiles], "overrides": sorted(overrides),
                                "config_id": config_id(config), "seed": self.house.seed})
