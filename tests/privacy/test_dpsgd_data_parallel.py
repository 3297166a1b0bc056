"""Data-parallel DP-SGD (pipeline.privacy.dpsgd.DPSGD over pipeline.distributed): two gloo processes release, step
by step, the gradient one process releases (same Poisson sample, diffusion draws and Gaussian noise, drawn once),
and end at the same weights, with either clipping route, a THA plan's per-bucket clips, and either way of drawing
the diffusion draws (one stream, or counter-keyed per micro-batch on each rank's device). A step asked for its
diagnostics gathers every rank's norms in the single process's order (two tensor all_gathers); a step not asked (DPDM's,
the classifier's) runs no collective but the gradient's all-reduce and releases the same gradient."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline import distributed
from pipeline.models.edm import EDMPrecond, edm_draw_loss, edm_sigma_sampler
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.privacy import dpsgd, tha

STEPS = 3
N = 24


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    spec = UNetSpec(image_size=8, channels=1, num_classes=3, block_out_channels=(8, 16), attention=(False, True),
                    norm_num_groups=4)
    return EDMPrecond(build_unet(spec))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(N, 1, 8, 8, generator=g), torch.arange(N) % 3


def plan(kind: str) -> dpsgd.StepPlan:
    if kind == "dpsgd":
        return dpsgd.DPSGDPlan(noise_multiplier=0.8, max_grad_norm=0.5, sampling_rate=0.5, dataset_size=N,
                               steps=STEPS, delta=1e-5)
    # two buckets with their own clips, one shared noise std (STRAIGHTDP Sec. 3.2)
    return tha.THAPlan(edges=(0.05, 0.5, 1.0), clips=(0.3, 0.7), noise_std=0.9, sampling_rate=0.5, dataset_size=N,
                       steps=STEPS, delta=1e-5)


def train(route: str, kind: str, draws: str = "stream", world: distributed.World | None = None, *,
          diagnostics: bool = True):
    """STEPS steps of the engine; per step the released gradient and the norms (gathered when ``diagnostics``, else
    this rank's own); the final weights."""
    model = tiny_model()
    if world is not None and world.rank == 1:
        with torch.no_grad():  # rank 0's weights must reach the other ranks (the engine broadcasts them)
            for p in model.parameters():
                p.add_(1.0)
    x, y = data()
    sampler = edm_sigma_sampler() if kind == "dpsgd" else tha.uniform_time_sampler
    engine = dpsgd.DPSGD(model, dpsgd.multiplicity_loss(edm_draw_loss), plan(kind), microbatch_size=3,
                         multiplicity=dpsgd.NoiseMultiplicity(2, sampler), generator=torch.Generator().manual_seed(1),
                         noise_generator=torch.Generator().manual_seed(2), clipping=route, world=world, draws=draws)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    released, norms = [], []
    for _ in range(STEPS):
        grads, info = engine.privatised_gradient((x, y), engine.sample(), diagnostics=diagnostics)
        assert info.complete == (diagnostics or engine.world.size == 1)
        for name, p in dpsgd.trainable_parameters(model).items():
            p.grad = grads[name]
        opt.step()
        engine.steps_taken += 1
        released.append({k: v.clone() for k, v in grads.items()})
        norms.append(info.grad_norms.cpu())
    return released, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}


#: (clipping route, plan, diffusion draws): "counter" draws each micro-batch's on its rank alone, from a generator
#: keyed by (seed, step, micro-batch), so two processes must still give the single process's gradient
CASES = [("vmap", "dpsgd", "stream"), ("ghost", "dpsgd", "stream"), ("ghost", "tha", "stream"),
         ("vmap", "dpsgd", "counter"), ("ghost", "tha", "counter")]


#: every collective torch.distributed offers; the test records which of them the steps call
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "gather", "gather_object",
               "broadcast", "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
               "scatter_object_list", "all_to_all", "all_to_all_single", "barrier", "send", "recv", "isend", "irecv")


def _rank(rank: int, size: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    try:
        results = {case: train(*case, world=distributed.current()) for case in CASES}
        # which collectives a run's calls make (delegated, so that no rank waits for one that failed)
        calls: list[str] = []
        for name in COLLECTIVES:
            original = getattr(dist, name)
            setattr(dist, name, lambda *a, _name=name, _f=original, **k: (calls.append(_name), _f(*a, **k))[1])
        for diagnostics in (False, True):
            calls.clear()
            run = train("ghost", "dpsgd", "stream", world=distributed.current(), diagnostics=diagnostics)
            results[("calls", diagnostics)] = (run, list(calls))
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gloo")
    mp.start_processes(_rank, args=(2, str(tmp / "init"), str(tmp)), nprocs=2, start_method="spawn")
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.fixture(scope="module")
def one_process():
    torch.set_num_threads(1)
    return {case: train(*case) for case in CASES}


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_two_gloo_processes_release_the_single_process_gradient_every_step(two_processes, one_process, case):
    ref_released, ref_norms, _ = one_process[case]
    for rank in (0, 1):
        released, norms, _ = two_processes[rank][case]
        for step in range(STEPS):
            assert all(close(released[step][k], ref_released[step][k]) for k in ref_released[step]), (rank, step)
            # every example's norm once, in the single process's order: the same Poisson sample and draws
            assert close(norms[step], ref_norms[step]), (rank, step)


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_two_gloo_processes_end_at_the_single_process_weights(two_processes, one_process, case):
    _, _, ref = one_process[case]
    for rank in (0, 1):
        _, _, weights = two_processes[rank][case]
        assert all(close(weights[k], ref[k]) for k in ref), rank
    # and on both ranks the same to the last bit (one all-reduce result, one broadcast start)
    assert all(torch.equal(two_processes[0][case][2][k], two_processes[1][case][2][k]) for k in ref)


def test_a_rank_that_also_drew_the_noise_would_be_caught(one_process):
    """The equality above is sensitive to the noise: a second draw of std s moves the released gradient."""
    released, _, _ = one_process[("vmap", "dpsgd", "stream")]
    p = plan("dpsgd")
    extra = {k: torch.randn(v.shape, generator=torch.Generator().manual_seed(9)) * p.noise_std / p.expected_batch_size
             for k, v in released[0].items()}
    assert not all(close(released[0][k] + extra[k], released[0][k]) for k in released[0])


def test_counter_draws_are_other_draws_than_the_stream_s_and_a_function_of_the_counters_alone():
    a, _, _ = train("vmap", "dpsgd", "stream")
    b, _, _ = train("vmap", "dpsgd", "counter")
    # the same Poisson sample and noise, other diffusion draws: another released gradient
    assert not all(close(a[0][k], b[0][k]) for k in a[0])
    draw = lambda key, step, j: torch.randn(4, generator=dpsgd.counter_generator(key, step, j))  # noqa: E731
    assert torch.equal(draw(1, 0, 0), draw(1, 0, 0))
    assert not torch.equal(draw(1, 0, 0), draw(1, 0, 1)) and not torch.equal(draw(1, 0, 0), draw(1, 1, 0))
    assert not torch.equal(draw(1, 0, 0), draw(2, 0, 0))


def test_an_unknown_way_of_drawing_is_a_one_line_error():
    with pytest.raises(dpsgd.DPSGDError, match="draws must be one of stream, counter, got 'philox'"):
        dpsgd.DPSGD(tiny_model(), dpsgd.multiplicity_loss(edm_draw_loss), plan("dpsgd"), draws="philox")


def test_a_step_not_asked_for_diagnostics_runs_no_collective_but_the_gradient_s_all_reduce(two_processes,
                                                                                         one_process):
    """DPDM's and the classifier's step: one all-reduce, no all_gather (of objects or tensors); the released gradient
    and the weights are those of a step asked for diagnostics, and its norms are this rank's micro-batches' alone."""
    ref_released, ref_norms, ref_weights = one_process[("ghost", "dpsgd", "stream")]
    for rank in (0, 1):
        (released, norms, weights), calls = two_processes[rank][("calls", False)]
        # the engine's constructor broadcasts rank 0's weights; each step: one all-reduce and nothing else
        model = tiny_model()
        tensors = len(list(model.parameters())) + len(list(model.buffers()))
        assert calls == ["broadcast"] * tensors + ["all_reduce"] * STEPS, calls
        asked, _ = two_processes[rank][("calls", True)]
        for step in range(STEPS):
            assert all(torch.equal(released[step][k], asked[0][step][k]) for k in released[step]), (rank, step)
            assert all(close(released[step][k], ref_released[step][k]) for k in ref_released[step]), (rank, step)
            # micro-batch j (3 examples) is on rank j mod 2: this rank's rows of the single process's norms
            own = torch.cat([ref_norms[step][j:j + 3] for j in range(3 * rank, len(ref_norms[step]), 6)]
                            or [torch.zeros(0)])
            assert close(norms[step], own), (rank, step)
        assert all(torch.equal(weights[k], asked[2][k]) for k in weights)
        assert all(close(weights[k], ref_weights[k]) for k in ref_weights)


def test_a_step_asked_for_diagnostics_gathers_with_two_tensor_all_gathers(two_processes):
    for rank in (0, 1):
        _, calls = two_processes[rank][("calls", True)]
        steps = [c for c in calls if c != "broadcast"]
        assert "all_gather_object" not in calls
        assert steps == ["all_reduce", "all_gather", "all_gather"] * STEPS, steps


def test_one_rank_s_norms_are_refused_by_the_quantiles():
    info = dpsgd.StepInfo(batch_size=4, grad_norms=torch.ones(2), losses=torch.ones(2), clip=1.0, complete=False)
    with pytest.raises(dpsgd.DPSGDError, match="every rank's gradient norms: run the step with diagnostics=True"):
        dpsgd.norm_quantiles(info)
