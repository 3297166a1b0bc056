"""The EMPDEN sampling grid: which cells the config asks for, and the file name of each.

A *cell* is one run of one EMPDEN sampler (EMPDEN Sec. 6, App. J):

* ``hybrid``     -- Algorithm 1: output-wise subsampled private block over the first p% of the
  N-step grid (subset size B), re-noised T grid steps back up, public denoiser to 0;
* ``per_step``   -- the same sampler with a fresh B-subset at every private step (Prop. C.1,
  Figure 2);
* ``full_batch`` -- every record at every step, down to ``sigma_min`` (Sec. 3.2, 6.1, Fig. 4);
* ``public_only``-- the public denoiser alone from sigma_max (no private block: eps = 0),
  the reference row of Table 2.

Symbols are the paper's: p = share of the N steps that are private (the handoff t0 = t_k,
k = ceil(p N / 100)), B = subsample size (q_B = B/n), T = number of public re-noising steps
(t1 = t_{k-T}), beta = public normaliser (App. E). Each cell is one target path, so one cell can
be rerun alone; numbers in paths never contain a dot (``0.5`` is written ``0p5``), so a path's
stem is also a valid Snakemake input name (the ledger replay keys its inputs by stem). A cell's name is
declared per method in the shared run-name grammar (:mod:`pipeline.runs`, :data:`CELL_NAMES`).

Pure Python (no torch): ``pipeline/methods/empden/wiring.py`` imports it to expand the target lists.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.runs import RunGrammar, RunNameError, choice, integer, number
# numbers in cell paths: the one run-name encoding (3 -> '3', 0.5 -> '0p5', 0.002 -> '0p002'), re-exported
from pipeline.runs import fmt_num as fmt_num
from pipeline.runs import parse_num as parse_num

METHODS = ("hybrid", "per_step", "full_batch", "public_only")

_SEED = integer("seed", "s", label="seed")
#: the subsampled samplers' cells: hybrid/p65_B50_T3_beta1_s0, per_step/...
_SUBSAMPLED = RunGrammar("EMPDEN cell", (number("p_percent", "p"), integer("B", "B"), integer("T", "T"),
                                         number("beta", "beta"), _SEED),
                         example="hybrid/p65_B50_T3_beta1_s0", head=choice("method", ("hybrid", "per_step")),
                         head_sep="/")
#: a cell's name (its path below samples/empden/) by method: ``<method>/`` and the symbols that method uses
CELL_NAMES = {
    "hybrid": _SUBSAMPLED,
    "per_step": _SUBSAMPLED,
    "full_batch": RunGrammar("EMPDEN cell", (number("sigma_min", "smin"), number("beta", "beta"), _SEED),
                             example="full_batch/smin0p002_beta1_s0", head=choice("method", ("full_batch",)),
                             head_sep="/"),
    "public_only": RunGrammar("EMPDEN cell", (_SEED,), example="public_only/s0",
                              head=choice("method", ("public_only",)), head_sep="/"),
}
#: any cell's name as a Snakemake wildcard constraint (no groups of its own)
CELL_PATTERN = "|".join(f"(?:{g.pattern})" for g in dict.fromkeys(CELL_NAMES.values()))


@dataclass(frozen=True, order=True)
class Cell:
    """One EMPDEN sampling run. Fields that do not apply to the method are None."""

    method: str
    seed: int
    beta: float | None = None
    p_percent: float | None = None
    B: int | None = None
    T: int | None = None
    sigma_min: float | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"EMPDEN method must be one of {', '.join(METHODS)}, got {self.method!r}")
        need = {"hybrid": ("p_percent", "B", "T", "beta"), "per_step": ("p_percent", "B", "T", "beta"),
                "full_batch": ("sigma_min", "beta"), "public_only": ()}[self.method]
        missing = [f for f in need if getattr(self, f) is None]
        if missing:
            raise ValueError(f"EMPDEN {self.method} cell needs {', '.join(missing)}")

    @property
    def name(self) -> str:
        """Path of the cell below samples/empden/ without suffix, e.g. ``hybrid/p65_B50_T3_beta1_s0``."""
        return CELL_NAMES[self.method].name_of(self)

    @classmethod
    def from_name(cls, name: str) -> Cell:
        """The cell a name (its path below samples/empden/, no suffix) is: the inverse of :attr:`name`."""
        method = name.split("/", 1)[0]
        if method not in CELL_NAMES:
            raise RunNameError(f"EMPDEN cell name {name!r} is not <method>/<symbols> (<method> one of "
                               f"{', '.join(METHODS)}; e.g. hybrid/p65_B50_T3_beta1_s0)")
        return cls(**CELL_NAMES[method].read(name))

    @property
    def ledger_stem(self) -> str:
        """File stem of the cell's own ledger transcript (unique across cells: parallel jobs never share one)."""
        return "empden_sample_" + self.name.replace("/", "_")

    @property
    def private(self) -> bool:
        """Whether the cell touches the private set (and so writes a ledger line)."""
        return self.method != "public_only"

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "seed": self.seed, "beta": self.beta, "p_percent": self.p_percent,
                "B": self.B, "T": self.T, "sigma_min": self.sigma_min, "cell": self.name}


def _products(grids: Iterable[Mapping[str, Any]]) -> list[tuple[float, int, int]]:
    out = []
    for g in grids:
        out += [(float(p), int(B), int(T)) for p, B, T in itertools.product(g["p"], g["B"], g["T"])]
    return out


def grid_cells(empden: Mapping[str, Any], accounting: Mapping[str, Any]) -> list[Cell]:
    """Every cell of the config's ``empden`` section (validated, defaults filled), sorted, no repeats.

    The main grid (Tables 8/9) is the union of the products p x B x T of ``empden.grid`` at
    beta = accounting.beta and every seed of ``empden.seeds``; the beta ablation (Table 3),
    the repeated seeds (Table 10), the Figure 2 pair, the full-batch sigma_min sweep (Fig. 4)
    and the public-only reference add their own cells. A cell asked for twice is run once.
    """
    beta = float(accounting["beta"])
    cells: set[Cell] = set()
    for seed in empden["seeds"]:
        for p, B, T in _products(empden["grid"]):
            cells.add(Cell("hybrid", seed, beta, p, B, T))
    ab = empden["beta_ablation"]
    if ab:
        for b in ab["beta"]:
            cells.add(Cell("hybrid", empden["seeds"][0], float(b), float(ab["p"]), int(ab["B"]), int(ab["T"])))
    rs = empden["repeated_seeds"]
    if rs:
        for seed, p in itertools.product(rs["seeds"], rs["p"]):
            cells.add(Cell("hybrid", seed, beta, float(p), int(rs["B"]), int(rs["T"])))
    f2 = empden["figure2"]
    if f2:
        for method in ("hybrid", "per_step"):
            cells.add(Cell(method, empden["seeds"][0], beta, float(f2["p"]), int(f2["B"]), int(f2["T"])))
    for s in empden["full_batch"]["sigma_min"]:
        cells.add(Cell("full_batch", empden["seeds"][0], beta, sigma_min=float(s)))
    if empden["public_only"]:
        cells.add(Cell("public_only", empden["seeds"][0]))
    return sorted(cells, key=lambda c: (METHODS.index(c.method), c.name))


def cell_from_wildcards(method: str, wildcards: Mapping[str, str]) -> Cell:
    """The cell of a target path's wildcards (the inverse of :attr:`Cell.name`)."""
    get = wildcards.get
    return Cell(method=method, seed=int(get("seed")),
                beta=parse_num(get("beta")) if get("beta") is not None else None,
                p_percent=parse_num(get("p")) if get("p") is not None else None,
                B=int(get("B")) if get("B") is not None else None,
                T=int(get("T")) if get("T") is not None else None,
                sigma_min=parse_num(get("smin")) if get("smin") is not None else None)
