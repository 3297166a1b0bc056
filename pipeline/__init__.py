"""DP generative models: data, privacy, training, sampling, evaluation and reporting.

Plain Python, no Snakemake import. Every DAG stage is a function
``stage(inputs, outputs, params)`` registered in :mod:`pipeline.cli`, runnable as
``python -m pipeline STAGE --in KEY=PATH ... --out KEY=PATH ... --params JSON``.
"""

__version__ = "0.1.0"
