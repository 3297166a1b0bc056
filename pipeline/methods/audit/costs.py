"""What the audits' jobs cost: the one-run canary audit (from how many ledger lines it reruns), DPDM's non-private
twin, the membership attacks on one model, and each of the audit's rules' request (:data:`REQUESTS`, read by
:meth:`pipeline.methods.audit.wiring.Wiring.resources`). Measured on CPU cores and scaled by image area and work,
x4 headroom. Pure functions of the validated config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline import resources as cost
from pipeline.resources import LIGHT_JOB, Request, Requested

Config = Mapping[str, Any]


def one_run_runtime_min(config: Config, n_lines: int, n_empden_lines: int = 0) -> int:
    """The one-run audit of ``n_lines`` ledger lines, ``n_empden_lines`` of them EMPDEN sampler blocks, x4 headroom.
    Any other line is costed as a DP-SGD line, T engine steps over the expected batch and the sampled canaries on a
    16-wide model (~5e-3 s per 64 records on one CPU core; 0.4 s for DPDM's embedded 79 steps), at the largest T
    and batch of DPDM and STRAIGHTDP (a release line costs far less); an EMPDEN line, the full grid's steps for
    N_out outputs over n + m records of m + 16 coordinates (~4 GFLOP/s on one CPU core: 12 s for an embedded
    hybrid block, 20 s full batch)."""
    d, s = config["dpdm"], config["straightdp"]["dpsgd"]
    n = config["data"]["private"]["n_private_train"] or 60000
    steps = max(-(-int(d["epochs"] * n) // d["batch_size"]), s["steps"])
    m = config["audit"]["canaries"]
    batch = max(d["batch_size"], s["batch_size"]) + m * max(d["batch_size"], 64) / n
    dpsgd_s = steps * max(batch, 64) / 64 * 5e-3
    n_out = config["empden"]["n_out"] or config["accounting"]["N_out"]
    empden_s = 2 * n_out * (n + m) * (m + 16) * config["accounting"]["N"] * 2.5e-10
    return max(5, int(4 * ((n_lines - n_empden_lines) * dpsgd_s + n_empden_lines * empden_s) / 60) + 5)


def twin_runtime_min(config: Config) -> int:
    """DPDM's non-private twin: T steps of one backward pass over B x K example-draws (no per-example
    gradients: ~5e-4 s per 16x16 draw on two CPU cores, ~1e-5 s on one GPU; x4 headroom on the GPU rate)."""
    d, m = config["dpdm"], config["audit"]["mia"]
    p = config["data"]["private"]
    n = (p["n_reference"] or 500) if m["twin_train_on"] == "members" else (p["n_private_train"] or 60000)
    batch = min(d["batch_size"], n)
    steps = -(-int(m["twin_epochs"] * n) // batch)
    return max(10, int(4 * steps * batch * m["twin_K"] * (cost.image_side(config) / 16) ** 2 * 1e-5 / 60) + 10)


def mia_runtime_min(config: Config) -> int:
    """Membership attacks on one model: (loss draws x sigmas + SecMI's inversion) forward passes over
    2 x n_reference records (~1e-4 s per 16x16 record-pass on two CPU cores), x4 headroom."""
    m = config["audit"]["mia"]
    n = 2 * (config["data"]["private"]["n_reference"] or 500)
    passes = m["loss_draws"] * len(m["loss_sigmas"]) + m["secmi_inversion_steps"] + 8
    return max(5, int(4 * passes * n * (cost.image_side(config) / 16) ** 2 * 1e-4 / 60) + 5)


#: each rule of rules/audit.smk -> its request (``w`` the asking wiring, :class:`pipeline.methods.audit.wiring.Wiring`)
REQUESTS: dict[str, Requested] = {
    # a function: the audited transcripts are the chosen methods' registered ones, known once every rule file is read
    "audit_one_run": lambda c, w: Request(mem_mb=2000, runtime=lambda wildcards: w.one_run_runtime_min()),
    # resumable: within the cluster's time limit, in segments
    "train_dpdm_twin": lambda c, w: Request(gpu=1, mem_mb=4000,
                                            runtime=cost.segment_runtime_min(c, twin_runtime_min(c))),
    "audit_mia": lambda c, w: Request(gpu=1, mem_mb=3000, runtime=mia_runtime_min(c)),
    "audit_mia_table": LIGHT_JOB,
    "empden_table13": LIGHT_JOB,
}
