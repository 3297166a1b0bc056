# DP generative models: regenerate every table and figure from one command.
#
#   snakemake --cores 2 all                       embedded default (CPU, minutes)
#   snakemake --profile slurm all                 paper scale on a SLURM cluster
#   snakemake --configfile configs/mnist.yaml ... a paper preset
#
# Rules only wire paths to stages in pipeline/ (python -m pipeline STAGE --help).
# Config `methods` chooses what `all` builds; each method's rules/<method>.smk registers its wiring
# (register(WIRING), rules/common.smk): its outputs, transcripts, runs and bundles. Docs: "Developing".

configfile: "config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/account.smk"
include: "rules/data.smk"
include: "rules/evaluate.smk"
include: "rules/report.smk"
include: "rules/sensgeo.smk"
include: "rules/empden.smk"
include: "rules/empden_diagnostics.smk"
include: "rules/dpdm.smk"
include: "rules/straightdp.smk"
include: "rules/baselines.smk"
include: "rules/audit.smk"
include: "rules/pretrain.smk"
include: "rules/review.smk"
include: "rules/bundles.smk"

# every method `methods:` chooses has its rule file included above: one line now, not rule all's traceback
try:
    OUTPUTS.check_registered()
except ValueError as _exc:
    sys.exit(str(_exc))


localrules:
    all,
    index_html,
    export_bundles,


rule all:
    default_target: True
    input:
        # a function: what each method's rule file registered for the config's `methods`
        lambda wildcards: OUTPUTS.all_targets(),


# slurm.cpu_partition: every job that asks for no GPU goes to the CPU partition (many clusters refuse CPU jobs on
# GPU partitions); GPU jobs keep the profile's default partition (DPGEN_SLURM_PARTITION). A rule's own resource
# overrides the profile's default-resources, so this is the one place the choice is made.
if config["slurm"]["cpu_partition"]:
    for _rule in workflow.rules:
        if not _rule.resources.get("gpu").raw:
            _rule.resources["slurm_partition"] = config["slurm"]["cpu_partition"]
