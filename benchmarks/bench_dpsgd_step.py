"""One DP-SGD step with noise multiplicity: ours (vmap, ghost) vs Opacus (hooks, ghost clipping) vs non-private.

Every arm trains the same diffusers ``UNet2DModel`` (16x16, one channel, one attention block, as
the embedded default would; ``--channels 128 256`` for a paper width) on the same logical batch
(default 256 examples x K = 4 noise draws = 1024 denoiser evaluations), in the same physical
micro-batches, with the same denoising loss:

* ``nonprivate``: plain ``loss.backward()`` on each micro-batch, gradients accumulated;
* ``torch.func``: :class:`pipeline.privacy.dpsgd.DPSGD` with ``clipping="vmap"`` --
  ``vmap(grad(...))`` per example (K draws as an inner batch), clip, sum, one Gaussian noise draw;
* ``ghost``: the same engine with ``clipping="ghost"`` (:mod:`pipeline.privacy.ghost`: mixed ghost
  norms and book-keeping, one forward and one backward, no per-example gradients);
* ``opacus``: ``opacus.GradSampleModule`` hooks on the B*K rows, per-row gradients summed
  over each example's K rows, then the same clip/sum/noise (the hooks are what is compared);
* ``opacus-ghost``: ``GradSampleModuleFastGradientClipping`` (Opacus' ghost clipping, two backward
  passes). Its privacy unit is the ROW: it cannot add up an example's K rows before clipping, so
  it clips B*K rows -- a cost comparison only, not DPDM's mechanism;
* ``ghost-2proc``: the ghost engine as two data-parallel gloo processes (:mod:`pipeline.distributed`: the same
  sample and draws on both, each computes half the micro-batches, one all-reduce), ``--threads`` each. Wall time
  is the slower rank's (barriers around the step), CPU time the two ranks' sum, peak memory the larger rank's.
  Its speed-up over ``ghost`` needs two free cores. Its step runs one collective, the gradient's all-reduce (DPDM's
  step); ``--diagnostics`` also gathers every rank's per-example norms and losses (STRAIGHTDP's step).

Every arm runs in its own child process so that its peak memory is its own: on CUDA the
peak allocated memory of the step, on the CPU the growth of the process' peak RSS during
the step (allocator caching makes this a rough figure). The arms alternate over several
rounds and the best time of each is kept, so that a shared machine's changing load hits all
arms alike; the process CPU time is printed next to the wall time because on a loaded
machine it is the steadier measure of work. Prints seconds per step, the ratios to the
non-private step, and peak memory, side by side. Opacus is optional
(``pip install opacus==1.6.0``); the arm is skipped when it is missing. Run:

    python benchmarks/bench_dpsgd_step.py                      # B = 256, K = 4, 1 thread
    python benchmarks/bench_dpsgd_step.py --batch 64 --rounds 1    # quick look
    python benchmarks/bench_dpsgd_step.py --device cuda --threads 8  # on a GPU
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ARMS = ("nonprivate", "torch.func", "ghost", "opacus", "opacus-ghost", "ghost-2proc")


def build_unet(channels: tuple[int, int]):
    from diffusers import UNet2DModel

    from pipeline.models.edm import vmap_friendly_attention

    torch.manual_seed(0)
    model = UNet2DModel(sample_size=16, in_channels=1, out_channels=1, block_out_channels=channels,
                        layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                        up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8)
    # The classic matmul attention (what EDMPrecond installs): torch.func has no batching rule
    # for the CPU flash kernel behind F.scaled_dot_product_attention. Same in every arm.
    return vmap_friendly_attention(model)


def draw_loss(model_fn, x, sigma, noise):
    """Per-draw denoising loss with EDM-style input scaling, shape [rows]."""
    s = sigma[:, None, None, None]
    out = model_fn((x + s * noise) / torch.sqrt(1 + s ** 2), torch.log(sigma) / 4).sample
    return (out - x).pow(2).flatten(1).mean(1)


def _sigma(n, g):
    return torch.exp(torch.randn(n, generator=g) * 1.2 - 1.2)


def _peak_start(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _peak_end(device, start):
    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - start


def run_arm(arm: str, args, queue, rank: int = 0, init_file: str = "") -> None:
    from pipeline.privacy import dpsgd

    torch.set_num_threads(args.threads)
    if init_file:  # one of two data-parallel ranks
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    device = torch.device(args.device)
    model = build_unet(tuple(args.channels)).to(device)
    n = args.batch
    data = torch.randn(n, 1, 16, 16, generator=torch.Generator().manual_seed(1)).to(device)
    plan = dpsgd.DPSGDPlan(noise_multiplier=1.0, max_grad_norm=1.0, sampling_rate=1.0, dataset_size=n,
                           steps=10 ** 6, delta=1e-5)
    mult = dpsgd.NoiseMultiplicity(args.K, _sigma)
    idx = torch.arange(n)

    if arm == "nonprivate":
        def step(rows: int):
            model.zero_grad(set_to_none=True)
            g = torch.Generator().manual_seed(0)
            for s in range(0, rows, args.microbatch):
                x = data[s:s + args.microbatch]
                sigma, noise = mult.draw(x, g)
                xk = x.unsqueeze(1).expand(-1, args.K, -1, -1, -1).reshape(-1, *x.shape[1:])
                draw_loss(model, xk, sigma.reshape(-1), noise.reshape(-1, *x.shape[1:])).sum().backward()
    elif arm in ("torch.func", "ghost", "ghost-2proc"):
        engine = dpsgd.DPSGD(model, dpsgd.multiplicity_loss(draw_loss), plan, microbatch_size=args.microbatch,
                             multiplicity=mult, generator=torch.Generator().manual_seed(0),
                             clipping="vmap" if arm == "torch.func" else "ghost",  # ghost-2proc: world from the group
                             draws=args.draws)

        def step(rows: int):
            engine.privatised_gradient((data,), idx[:rows], diagnostics=args.diagnostics)
    else:
        from opacus import GradSampleModule
        from opacus.grad_sample import GradSampleModuleFastGradientClipping

        params = dpsgd.trainable_parameters(model)
        if arm == "opacus-ghost":
            gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="sum",
                                                       max_grad_norm=plan.max_grad_norm, use_ghost_clipping=True)

            def clipped_sum(b: int, loss: torch.Tensor) -> dict[str, torch.Tensor]:
                loss.sum().backward(retain_graph=True)  # pass 1: the hooks' per-ROW norms
                coeff = gsm.get_clipping_coef()
                gsm.zero_grad(set_to_none=True)
                gsm.disable_hooks()
                (coeff.to(loss.device) * loss).sum().backward()  # pass 2: the clipped sum
                gsm.enable_hooks()
                return {k: p.grad for k, p in params.items()}
        else:
            gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")

            def clipped_sum(b: int, loss: torch.Tensor) -> dict[str, torch.Tensor]:
                (loss.reshape(b, args.K).mean(1)).sum().backward()  # the example loss: mean over K
                per_example = {k: p.grad_sample.reshape(b, args.K, *p.shape).sum(1) for k, p in params.items()}
                for p in params.values():
                    p.grad_sample = None
                return dpsgd.clip_and_sum(per_example, plan.max_grad_norm)[0]

        def step(rows: int):
            total = {k: torch.zeros_like(p) for k, p in params.items()}
            g = torch.Generator().manual_seed(0)
            for s in range(0, rows, args.microbatch):
                x = data[s:s + args.microbatch]
                sigma, noise = mult.draw(x, g)
                xk = x.unsqueeze(1).expand(-1, args.K, -1, -1, -1).reshape(-1, *x.shape[1:])
                loss = draw_loss(gsm, xk, sigma.reshape(-1), noise.reshape(-1, *x.shape[1:]))  # per row
                for k, t in clipped_sum(x.shape[0], loss).items():
                    total[k].add_(t)
                for p in params.values():
                    p.grad = None
            for t in total.values():
                t.add_(torch.randn_like(t), alpha=plan.noise_std).div_(plan.expected_batch_size)

    # warm-up (allocations, kernels): one micro-batch per process, so every rank of ghost-2proc has computed one
    step(min(n, args.microbatch * (2 if init_file else 1)))
    if device.type == "cuda":
        torch.cuda.synchronize()
    start_mem = _peak_start(device)
    wall, cpu = [], []
    for _ in range(args.repeats):
        if init_file:
            dist.barrier()
        t, c = time.perf_counter(), time.process_time()
        step(n)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if init_file:
            dist.barrier()  # the step ends when the slower rank's does
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    queue.put((arm, min(wall), min(cpu), _peak_end(device, start_mem)))
    if init_file:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256, help="logical batch (examples)")
    ap.add_argument("--K", type=int, default=4, help="noise multiplicity")
    ap.add_argument("--microbatch", type=int, default=64, help="physical micro-batch (examples)")
    ap.add_argument("--channels", type=int, nargs=2, default=[16, 32], help="UNet block_out_channels")
    ap.add_argument("--repeats", type=int, default=1, help="timed steps per arm process")
    ap.add_argument("--rounds", type=int, default=2,
                    help="arms run in alternation this many times (a shared machine's load hits all arms)")
    # One thread by default: with 2 OpenMP threads on a shared machine, the same arm's time
    # swung 3-25 s between runs (threads wait at every barrier for a pre-empted sibling);
    # single-threaded it repeats to a few percent.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--draws", default="stream", choices=["stream", "counter"],
                    help="the engine arms' diffusion draws (pipeline.privacy.dpsgd): stream = one stream every rank "
                         "repeats in full; counter = per micro-batch, each rank its own")
    ap.add_argument("--diagnostics", action="store_true",
                    help="the engine arms' steps also gather every rank's per-example norms and losses (STRAIGHTDP)")
    args = ap.parse_args()

    n_params = sum(p.numel() for p in build_unet(tuple(args.channels)).parameters())
    print(f"UNet2DModel 16x16, block_out_channels={tuple(args.channels)}, {n_params:,} parameters; "
          f"logical batch {args.batch} x K={args.K}, micro-batch {args.microbatch}, device {args.device}, "
          f"{args.threads} threads, best of {args.rounds} alternating rounds x {args.repeats} steps, "
          f"{args.draws} draws{', diagnostics gathered' if args.diagnostics else ''}")
    arms = list(args.arms)
    if {"opacus", "opacus-ghost"} & set(arms):
        import importlib.util

        if importlib.util.find_spec("opacus") is None:
            print("opacus: not installed, both arms skipped (pip install opacus==1.6.0)")
            arms = [a for a in arms if not a.startswith("opacus")]
    ctx = mp.get_context("spawn")
    results: dict[str, tuple[float, float, float]] = {}
    for _ in range(args.rounds):
        for arm in arms:
            queue = ctx.Queue()
            ranks = 2 if arm == "ghost-2proc" else 1
            with tempfile.TemporaryDirectory() as tmp:
                init = os.path.join(tmp, "init") if ranks > 1 else ""
                procs = [ctx.Process(target=run_arm, args=(arm, args, queue, r, init)) for r in range(ranks)]
                for proc in procs:
                    proc.start()
                got = [queue.get() for _ in procs]  # before join: a child cannot exit with its queue unread
                for proc in procs:
                    proc.join()
            if any(proc.exitcode != 0 for proc in procs):
                print(f"{arm}: FAILED (exit codes {[proc.exitcode for proc in procs]})")
                continue
            wall, cpu, peak = max(g[1] for g in got), sum(g[2] for g in got), max(g[3] for g in got)
            old = results.get(arm, (math.inf, math.inf, 0.0))
            results[arm] = (min(old[0], wall), min(old[1], cpu), max(old[2], peak))
            print(f"  {arm}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    base_wall, base_cpu, _ = results.get("nonprivate", (math.nan, math.nan, 0.0))
    _, _, base_peak = results.get("nonprivate", (0.0, 0.0, math.nan))
    print(f"{'arm':<14}{'wall s':>9}{'x nonpriv':>11}{'CPU s':>9}{'x nonpriv':>11}{'peak MiB':>10}{'x nonpriv':>11}")
    for arm, (wall, cpu, peak) in results.items():
        print(f"{arm:<14}{wall:>9.2f}{wall / base_wall:>11.2f}{cpu:>9.2f}{cpu / base_cpu:>11.2f}"
              f"{peak / 2 ** 20:>10.0f}{peak / base_peak if base_peak else math.nan:>11.2f}")


if __name__ == "__main__":
    main()
