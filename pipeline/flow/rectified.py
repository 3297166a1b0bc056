"""Rectified flow in STRAIGHTDP's convention: the straight path, its loss, its Euler sampler.

STRAIGHTDP Sec. 2 "Rectified flow": flow noise xi ~ N(0, I), data z, flow time t in [0, 1] with
**t = 0 the noise end**:

* path (eq. 1) x_t = (1 - t) xi + t z, so dx_t/dt = z - xi, the regression target;
* loss (eq. 1) || v_theta(x_t, t, c) - (z - xi) ||^2 (:func:`flow_loss`, here the MEAN over the
  coordinates of one example, see there);
* sampling integrates dx/dt = v from t = 0 (or a guided start t0, Sec. 3.1 "Sampling-time
  guidance") to 1 with classifier-free guidance (:func:`euler_sample`; Table 9: 25 Euler steps,
  guidance 1.5).

This is the ``rectified_flow_t`` convention of :data:`pipeline.models.denoiser.CONVENTIONS`. Note
that SD3 (Esser et al. 2024) writes the same path with the time reversed (its sigma = 1 - t is
the noise fraction) and regresses noise - data; :mod:`pipeline.flow.backbone` maps between the two.

Every function here is a formula on tensors: no module state, no progress bar, no randomness
other than the ``generator`` passed in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

#: ``v(x [B, ...], t [B], y [B] long) -> velocity [B, ...]``, or ``v(x, t)`` for an unconditional model
VelocityFn = Callable[..., Tensor]


def _per_example(t: Tensor | float, like: Tensor) -> Tensor:
    """``t`` (a float, a 0-d tensor or ``[B]``) as a ``[B, 1, ..., 1]`` tensor broadcasting against ``like``."""
    t = torch.as_tensor(t, dtype=like.dtype, device=like.device)
    if t.ndim == 0:
        return t
    if t.shape != like.shape[:1]:
        raise ValueError(f"t must be a scalar or have shape [{like.shape[0]}] (one time per example), "
                         f"got {tuple(t.shape)}")
    return t.reshape((-1,) + (1,) * (like.ndim - 1))


def interpolate(z: Tensor, xi: Tensor, t: Tensor | float) -> Tensor:
    """x_t = (1 - t) xi + t z (STRAIGHTDP eq. 1; t = 0 the noise end), ``t`` scalar or one per example."""
    tt = _per_example(t, z)
    return (1 - tt) * xi + tt * z


def x_t_from(z: Tensor, xi: Tensor, t: Tensor | float) -> Tensor:
    """The state at time ``t`` of the straight path from ``xi`` to ``z`` (same formula as :func:`interpolate`).

    The guided start of Sec. 3.1 ("Sampling-time guidance") is ``x_t_from(z, xi, t0)`` with
    z ~ N(mu_y, Sigma) drawn by the moment model
    (:meth:`pipeline.flow.field.GaussianMomentModel.sample`) and xi ~ N(0, I): then
    x_{t0} ~ N(t0 mu_y, t0^2 Sigma + (1 - t0)^2 I), the moment model's marginal at t0, without
    ever forming that d x d covariance (:func:`pipeline.flow.field.guided_start` does both draws).
    """
    return interpolate(z, xi, t)


def velocity_target(z: Tensor, xi: Tensor) -> Tensor:
    """The regression target z - xi = dx_t/dt of the straight path (eq. 1); the same at every t."""
    return z - xi


def flow_loss(model_fn: VelocityFn, z: Tensor, t: Tensor, xi: Tensor, *cond: Tensor) -> Tensor:
    """Per-example rectified-flow loss mean_j (v(x_t, t, y) - (z - xi))_j^2, shape ``[B]`` (eq. 1).

    ``z`` ``[B, ...]`` data, ``t`` ``[B]`` times, ``xi`` ``[B, ...]`` flow noise, ``cond`` the
    optional labels ``[B]`` (the null label for the unconditional branch). The signature is that
    of a per-draw loss of :func:`pipeline.privacy.dpsgd.multiplicity_loss` (``x, sigma, noise,
    *cond`` with "sigma" = t), so DP-SGD with noise multiplicity and
    :func:`pipeline.privacy.dpsgd.per_example_gradients` take it unchanged.

    The squared error is AVERAGED over the d coordinates (eq. 1 writes the sum): the loss, and so
    every per-example gradient a clip norm C is compared with, keeps the same scale across image
    sizes. The sum is d times this; a clip norm calibrated for one is off by d for the other.
    """
    x = interpolate(z, xi, t)
    v = model_fn(x, t, *cond)
    return (v - velocity_target(z, xi)).pow(2).flatten(1).mean(1)


def sample_t(n: int, generator: torch.Generator | None = None, lo: float = 0.0, hi: float = 1.0,
             dtype: torch.dtype = torch.float32) -> Tensor:
    """``n`` flow times uniform on [lo, hi) (the training distribution of eq. 1 is U[0, 1]).

    Drawn in float64 and cast; a draw that the cast rounds up to ``hi`` is put back just below it,
    so a time bucket [lo, hi) never receives its neighbour's edge.
    """
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"flow times need 0 <= lo < hi <= 1, got lo={lo}, hi={hi}")
    t = (lo + (hi - lo) * torch.rand(n, generator=generator, dtype=torch.float64)).to(dtype)
    below = torch.nextafter(torch.tensor(hi, dtype=dtype), torch.tensor(lo, dtype=dtype))
    return torch.minimum(t, below)


def euler_times(t0: float, steps: int) -> Tensor:
    """The Euler grid t0 = t_0 < t_1 < ... < t_steps = 1, equally spaced (float64)."""
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not 0.0 <= t0 < 1.0:
        raise ValueError(f"the start time t0 must be in [0, 1), got {t0}")
    return torch.linspace(t0, 1.0, steps + 1, dtype=torch.float64)


def guided_velocity(velocity_fn: VelocityFn, x: Tensor, t: Tensor, y: Tensor | None, *, guidance: float,
                    null_label: int | None) -> Tensor:
    """Classifier-free guidance v = v_null + w (v_cond - v_null) (Ho & Salimans 2022), one batched call.

    ``w = 1`` evaluates the conditional branch only, ``w = 0`` the null branch only; any other ``w``
    stacks both branches into one batch of 2B. ``y=None``: an unconditional model, called as
    ``velocity_fn(x, t)`` whatever ``w``.
    """
    if y is None:
        return velocity_fn(x, t)
    if guidance == 1.0:
        return velocity_fn(x, t, y)
    if null_label is None:
        raise ValueError(f"guidance {guidance} != 1 needs the null label of the unconditional branch")
    null = torch.full_like(y, int(null_label))
    if guidance == 0.0:
        return velocity_fn(x, t, null)
    v = velocity_fn(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]))
    v_cond, v_null = v.chunk(2)
    return v_null + guidance * (v_cond - v_null)


@torch.no_grad()
def euler_sample(velocity_fn: VelocityFn, *, x0: Tensor, t0: float = 0.0, steps: int = 25, y: Tensor | None,
                 guidance: float = 1.5, null_label: int | None = None) -> Tensor:
    """Integrate dx/dt = v(x, t, y) from ``t0`` to 1 by ``steps`` Euler steps (STRAIGHTDP Sec. 2; Table 9).

    ``x0`` is the state at ``t0``: standard normal at t0 = 0, or a guided start
    (:func:`pipeline.flow.field.guided_start`) at t0 > 0. ``v`` is the classifier-free-guided
    velocity of :func:`guided_velocity` (``guidance`` w, ``null_label`` the label the model was
    trained to read as "no class"). The whole batch moves together; no autograd, no progress bar
    (the caller loops over batches and shows progress). Each step's velocity is cast to ``x0``'s
    dtype, so a float32 network can drive a float64 state.
    """
    times = euler_times(float(t0), steps)
    x = x0
    for t_cur, t_next in zip(times[:-1].tolist(), times[1:].tolist()):
        t = torch.full((x.shape[0],), t_cur, dtype=x.dtype, device=x.device)
        v = guided_velocity(velocity_fn, x, t, y, guidance=guidance, null_label=null_label)
        x = x + (t_next - t_cur) * v.to(x.dtype)
    return x
