"""Calibrate the link model from measured sends: gloo between two processes on this machine.

Two processes exchange a small and a large tensor back and forth (ping-pong, the way a pipeline's activation
and its gradient travel) over ``torch.distributed``'s gloo backend, the one ``stallfree train`` uses on CPU.
Half the round trip of the small message is the latency; the large message's extra time over it gives the
bandwidth: ``bytes / (t_large - t_small)`` per direction. Medians of the repeats.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from stallfree.stage_runtime.plan.costs import Link

__all__ = ["calibrate_gloo_link"]

SMALL, LARGE = 1024, 4 * 2**20  # bytes


def _ping_pong(rank: int, port: int, repeats: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        times = {}
        for nbytes in (SMALL, LARGE):
            x = torch.zeros(nbytes // 4)
            rounds = []
            for i in range(repeats + 2):  # two untimed: connection set-up and first-touch
                start = time.perf_counter()
                if rank == 0:
                    dist.send(x, 1)
                    dist.recv(x, 1)
                else:
                    dist.recv(x, 0)
                    dist.send(x, 0)
                if i >= 2:
                    rounds.append(time.perf_counter() - start)
            times[nbytes] = statistics.median(rounds)
        if rank == 0:
            queue.put(times)
    finally:
        dist.destroy_process_group()


def calibrate_gloo_link(repeats: int = 20) -> Link:
    """The link between two stage processes on this machine, measured as described above."""
    import torch.multiprocessing as mp

    from stallfree.stage_runtime.train.launcher import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_ping_pong, args=(r, port, repeats, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        times = queue.get(timeout=120)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    latency = times[SMALL] / 2
    extra = max(times[LARGE] / 2 - latency, 1e-9)
    return Link((LARGE - SMALL) / extra, latency)
