"""What the toy method's jobs cost: each of its rules' request (:data:`REQUESTS`, read by its wiring's
``resources``), from the validated configuration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.resources import TABLE_JOB, Request, Requested

Config = Mapping[str, Any]


def release_mem_mb(config: Config) -> int:
    """The release holds the private split as float64 rows, twice (the rows and their clipped copy), over a
    500 MB interpreter with numpy."""
    private = config["data"]["private"]
    pixels = int(config["data"]["image_size"]) ** 2 * 3
    return 500 + 2 * 8 * pixels * int(private["n_private_train"]) // 2**20


#: each rule of rules/toymean.smk -> its request
REQUESTS: dict[str, Requested] = {
    "toymean_release": lambda c, w: Request(mem_mb=release_mem_mb(c), runtime=5),
    "evaluate_toymean": Request(mem_mb=3000, runtime=15),
    "toymean_table": TABLE_JOB,
}
