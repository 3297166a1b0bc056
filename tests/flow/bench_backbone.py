"""Time of one step of the class-conditional MM-DiT: non-private forward+backward vs DP-SGD per-example gradients.

Not a test (pytest collects ``test_*.py`` only): a measurement the embedded run is sized from.
For each architecture it times, on a batch of ``--batch`` examples at ``--image`` pixels,

* ``fwd+bwd``: ``flow_loss(...).mean().backward()`` (public pretraining's step, minus the optimiser);
* ``per-example K=1``: :func:`pipeline.privacy.dpsgd.per_example_gradients` on :func:`flow_loss`;
* ``per-example K=4``: the same with noise multiplicity 4 (Table 9, Stage 2) through
  :func:`pipeline.privacy.dpsgd.multiplicity_loss`,

best of ``--reps`` (after one warm-up), wall and process CPU seconds. Run:

    python tests/flow/bench_backbone.py                       # CPU, 1 thread, batch 64
    python tests/flow/bench_backbone.py --device cuda --paper  # plus Table 9's 28x28 backbone
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from pipeline.flow.backbone import FlowSpec, build_flow_model  # noqa: E402
from pipeline.flow.rectified import flow_loss  # noqa: E402
from pipeline.privacy.dpsgd import multiplicity_loss, per_example_gradients  # noqa: E402

#: (name, spec keyword arguments) at 16x16, patch 2, 10 classes
CONFIGS = {
    "w32-L4": dict(num_attention_heads=2, attention_head_dim=16, caption_projection_dim=32, num_layers=4),
    "w48-L2": dict(num_attention_heads=3, attention_head_dim=16, caption_projection_dim=48, num_layers=2),
    "w48-L3": dict(num_attention_heads=3, attention_head_dim=16, caption_projection_dim=48, num_layers=3),
    "w64-L2": dict(num_attention_heads=4, attention_head_dim=16, caption_projection_dim=64, num_layers=2),
}
#: Table 9's backbone: width 192, depth 6, 6 heads, patch 4 at 28x28, caption width 64, length 8
PAPER = dict(image_size=28, patch_size=4, num_layers=6, num_attention_heads=6, attention_head_dim=32,
             caption_projection_dim=192, joint_attention_dim=64, caption_tokens=8, pos_embed_max_size=7,
             pooled_projection_dim=64)


def best_of(fn, reps: int, device: torch.device) -> tuple[float, float]:
    fn()  # warm-up
    walls, cpus = [], []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        w, c = time.perf_counter(), time.process_time()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus)


def bench(name: str, spec: FlowSpec, batch: int, reps: int, device: torch.device) -> None:
    torch.manual_seed(0)
    model = build_flow_model(spec).to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    shape = (batch, spec.channels, spec.image_size, spec.image_size)
    z, xi = torch.randn(shape, generator=g).to(device), torch.randn(shape, generator=g).to(device)
    t, y = torch.rand(batch, generator=g).to(device), torch.randint(spec.num_classes + 1, (batch,), generator=g).to(device)
    t4, xi4 = torch.rand(batch, 4, generator=g).to(device), torch.randn((batch, 4, *shape[1:]), generator=g).to(device)

    def fwd_bwd() -> None:
        model.zero_grad(set_to_none=True)
        flow_loss(model, z, t, xi, y).mean().backward()

    def one(model_fn, zi, ti, xii, yi):
        return flow_loss(model_fn, zi[None], ti[None], xii[None], yi[None])[0]

    k4 = multiplicity_loss(flow_loss)
    rows = [("fwd+bwd", fwd_bwd),
            ("per-example K=1", lambda: per_example_gradients(model, one, (z, t, xi, y))),
            ("per-example K=4", lambda: per_example_gradients(model, k4, (z, t4, xi4, y)))]
    for arm, fn in rows:
        wall, cpu = best_of(fn, reps, device)
        print(f"{name:8s} {n_params:>9,d} params  {arm:16s} wall {wall:7.3f} s  cpu {cpu:7.3f} s  "
              f"({1e3 * wall / batch:.2f} ms/example)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--paper", action="store_true", help="also Table 9's 28x28 backbone")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, batch {args.batch}")
    for name in args.configs.split(","):
        bench(name, FlowSpec(num_classes=10, **CONFIGS[name]), args.batch, args.reps, device)
    if args.paper:
        bench("table9", FlowSpec(num_classes=10, **PAPER), args.batch, args.reps, device)


if __name__ == "__main__":
    main()
