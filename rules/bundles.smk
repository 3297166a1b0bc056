# Certified bundles: each private run's weights (safetensors, diffusers layout) or synthetic set, with its ledger
# transcripts, their replay (at export), a certificate and a model card, in results/bundles/<method>/<run>/; a reader
# checks one with the command verify_bundle PATH (pipeline/bundles/cli.py). Code: pipeline/bundles/ (bundle.py: the
# stage export_bundle); wiring: pipeline/bundles/wiring.py; each method's bundles: its wiring's bundle_runs and
# bundle (registered by register(WIRING) in rules/<method>.smk). Resources: pipeline/resources.py HOUSE_REQUESTS.
#
#   snakemake results/bundles/dpdm/edm_eps1_K1_seed0        one run's bundle
#   snakemake export_bundles                                 every bundle (make bundles)

from pipeline.bundles.wiring import Wiring as _BundleWiring

BUNDLES = _BundleWiring(HOUSE, REGISTRY)


rule export_bundle:
    """One private run's bundle: its weights or synthetic set, transcripts and their replay, certificate, card."""
    input:
        unpack(BUNDLES.inputs),
    output:
        bundle=directory(BUNDLES.path("{method}", "{run}")),
    wildcard_constraints:
        method="[a-z_]+",
        run="[A-Za-z0-9_.-]+",
    params:
        p=BUNDLES.params,
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "export_bundle" / "{method}_{run}.log",
    benchmark:
        benchmark_path("export_bundle", "{method}/{run}")
    threads: 1
    resources: **HOUSE.resources("export_bundle")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline export_bundle {params.ins} --out bundle={output.bundle:q} --params {params.p:q}"
        " --log {log:q}"


rule export_bundles:
    """Every private run's bundle (make bundles); a reader checks each with the command verify_bundle PATH."""
    input:
        lambda wildcards: BUNDLES.paths(),
