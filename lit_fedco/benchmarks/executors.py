"""Client-steps per second: vectorized executor vs the per-client loop, measured in one run.

    python -m lit_fedco.benchmarks.executors [--clients 10 100 1000] [--model logreg mlp]

Each configuration runs full rounds of :class:`~lit_fedco.loop.FederatedLoop` (cohort = all K
clients, I local steps, batch b, on the embedded digits split IID over K clients) on one process;
the first round is a warm-up and is not timed. Sampling, gathering, the local steps and the
aggregation are all inside the timed region; evaluation is not.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
from lightning.fabric import Fabric

from lit_fedco.data import make_federated
from lit_fedco.executors import make_executor
from lit_fedco.loop import FederatedLoop, LoopConfig
from lit_fedco.models import build_model
from lit_fedco.updaters import get_updater


def client_steps_per_second(
    fabric: Fabric,
    k: int,
    executor: str,
    model: str,
    updater: str,
    steps: int,
    batch: int,
    min_time: float,
) -> float:
    """Timed rounds of one configuration; returns cohort-clients × local steps per second."""
    data = make_federated(
        SimpleNamespace(
            name="digits",
            data_dir="",
            partition="iid",
            num_clients=k,
            big=0,
            small=0,
            small_classes=0,
            alpha=0.5,
            rho=0.28,
            val_per_client=1,
            seed=0,
        )
    )
    net = build_model(model, tuple(data.x_train.shape[1:]), data.num_classes, seed=0)
    cls = get_updater(updater)
    upd = cls(cls.hparams_cls(), net)
    cfg = LoopConfig(rounds=10**6, local_steps=steps, cohort=k, batch_size=batch, progress=False)
    loop = FederatedLoop(fabric, upd, data, cfg, make_executor(executor))
    loop.run_round()  # warm-up: vmap tracing, buffer allocation
    rounds, start = 0, time.perf_counter()
    while rounds < 2 or time.perf_counter() - start < min_time:
        loop.run_round()
        rounds += 1
    return rounds * k * steps / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--model", nargs="+", default=["logreg", "mlp"])
    p.add_argument("--updater", default="comfedl")
    p.add_argument("--local-steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--min-time", type=float, default=2.0, help="seconds timed per configuration")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    fabric = Fabric(accelerator="cpu", devices=1)
    print(
        f"updater={args.updater} I={args.local_steps} b={args.batch_size} "
        f"threads={torch.get_num_threads()} torch={torch.__version__}"
    )
    print(f"{'model':<8}{'K':>6}{'vectorized/s':>15}{'sequential/s':>15}{'ratio':>8}")
    for model in args.model:
        for k in args.clients:
            rates = {
                ex: client_steps_per_second(
                    fabric,
                    k,
                    ex,
                    model,
                    args.updater,
                    args.local_steps,
                    args.batch_size,
                    args.min_time,
                )
                for ex in ("vectorized", "sequential")
            }
            ratio = rates["vectorized"] / rates["sequential"]
            print(
                f"{model:<8}{k:>6}{rates['vectorized']:>15.0f}{rates['sequential']:>15.0f}"
                f"{ratio:>7.1f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
