"""The text-conditional moment model of STRAIGHTDP App. C (Table 4): caption featurisations and the
post-processing of a text release (:mod:`pipeline.privacy.text_moments`) into a Gaussian model.

Captions are composed-MNIST's templated slots (class, quadrant marker, stroke thickness;
:mod:`pipeline.data.composed`). Two featurisations e(c) (App. C (iii)):

* ``one_hot_class``: the class slot alone, one-hot: the class-conditional release's special case
  (Prop. B.10); it cannot say where the marker is or how thick the stroke is;
* ``slot_indicators``: one one-hot block per slot.

Both are centred at the mean over the caption set (uniform over slot values: the composer draws the
quadrant and the thickness uniformly, and a uniform class prior is assumed: public knowledge, no data)
and carry the intercept column of :func:`text_moments.with_intercept` (App. C (i)). R_txt is the
largest centred norm over every caption, so no caption is clipped.

The model (Prop. 3.1 with mu_y replaced by mu(c): "conditioning only moves the mean"):
mu(c) = m + P^T W e(c) with W the ridge map of the release, and one covariance shared by every
caption, fitted on the PUBLIC composed images (not released; see :func:`public_residual_covariance`).
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.data.composed import SLOT_SIZES
from pipeline.flow.field import GaussianMomentModel
from pipeline.privacy import moments, text_moments
# the featurisations and their public centre and radius R_txt: torch-free in text_moments, so that the wiring registers
# each Table 4 line's q and R_txt from the same code (pipeline/methods/straightdp/wiring.py)
from pipeline.privacy.text_moments import FEATURISATIONS, CaptionCoding, caption_slots, featurise  # noqa: F401


def noise_ridge(plan: text_moments.TextReleasePlan, scale: float) -> float:
    """lambda = scale x the expected spectral norm of the noise on M_cc (2 sqrt(q) x its entry std,
    un-whitened): a function of the declared plan only, so choosing it costs no privacy."""
    return float(scale * 2.0 * math.sqrt(plan.q) * plan.noise_std * plan.R_txt**2)


def public_residual_covariance(f_public: np.ndarray, public_slots: np.ndarray, geometry: moments.PublicGeometry,
                               *, rank: int, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """The covariance every caption shares, from PUBLIC composed features ``f_public [n, p]``: the residual
    of their least-squares fit on the quadrant and thickness indicators (the slots the composer set; the
    public set's own classes are not assumed to be digits), top ``rank`` eigenpairs floored at ``floor``,
    lifted to data space: (V [d, r], s [r])."""
    design = np.concatenate([np.ones((len(public_slots), 1)),
                             text_moments.slot_indicators(public_slots[:, 1:], SLOT_SIZES[1:])], axis=1)
    coef, *_ = np.linalg.lstsq(design, f_public, rcond=None)
    resid = f_public - design @ coef
    evals, evecs = np.linalg.eigh(resid.T @ resid / len(resid))
    order = np.argsort(evals)[::-1][:rank]
    return geometry.basis.T @ evecs[:, order], np.maximum(evals[order], floor)


def text_conditional_model(W: np.ndarray, coding: CaptionCoding, geometry: moments.PublicGeometry, *,
                           eigvecs: np.ndarray, eigvals: np.ndarray, floor: float) -> GaussianMomentModel:
    """One Gaussian per caption of :func:`caption_slots` (its "class" index): mu(c) = m + P^T W e(c), the
    shared covariance V diag(s) V^T + floor (I - V V^T). Post-processing of the release ``W [p, q]``."""
    e = coding.encode(caption_slots())
    mu = geometry.mean + (e @ W.T) @ geometry.basis
    return GaussianMomentModel.from_arrays(pi=np.full(len(mu), 1.0 / len(mu)), mu=mu, eigvecs=eigvecs,
                                           eigvals=eigvals, floor=floor)
