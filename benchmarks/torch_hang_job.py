#!/usr/bin/env python3
"""A real PyTorch job on CPU (gloo) that hangs on demand, to be asked for its evidence.

Without ``--rank`` it is the launcher: it starts ``--world-size`` copies of itself, one
process per rank (as torchrun does: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` on a 127.0.0.1 TCPStore), each with its own
``TORCH_WORKER_SERVER_SOCKET`` under ``--socket-dir`` (one path per process: the
worker server refuses a path that exists), and waits for them.  Each rank wraps its
loop in ``torch.distributed.elastic.control_plane.worker_main()``, which starts the
control plane's worker server on that socket, and keeps a Flight Recorder ring
(``TORCH_FR_BUFFER_SIZE``).  Every rank prints JSON lines a harness reads::

    {"event": "ready", "rank": 1, "pid": 4321, "host": "node-1", "socket": "/tmp/s/rank1.sock"}
    {"event": "step", "rank": 1, "step": 3}
    {"event": "fault", "rank": 1, "fault": "python", "step": 3}

Faults, for ``--fault-rank`` at ``--fault-step``:

- ``python``: stuck in ``stuck_in_python`` (waiting on a lock nobody releases), so it
  never enters that step's all_reduce; the others wait in it;
- ``collective``: an all_reduce on a subgroup the others never call, then stuck there;
  the others wait in the next step's all_reduce;
- ``dead``: ``os._exit(3)`` mid-run (gloo sees the connection close: the others fail
  at once rather than hang, unlike NCCL);
- ``none``: runs ``--steps`` steps (0: until killed).

Usage::

    /work/torchvenv/bin/python benchmarks/torch_hang_job.py --world-size 2 \\
        --fault python --fault-rank 1 --fault-step 3 --socket-dir /tmp/socks
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

FAULTS = ("none", "python", "collective", "dead")


def say(**fields: object) -> None:
    # One write of under PIPE_BUF bytes: the ranks share one stdout, and a pipe keeps
    # such a write whole (print writes the text and its newline apart).
    os.write(1, (json.dumps(fields) + "\n").encode())


def stuck_in_python() -> None:
    """Wait on a lock nobody releases: the Python stack names this function."""
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # blocks for ever, with the GIL released (stacks can be taken)


def wait_like_nccl(store: object, timeout_s: float) -> None:
    """Where NCCL would leave a rank waiting for a dead peer: on the store, for as long."""
    store.set_timeout(timedelta(seconds=timeout_s))  # type: ignore[attr-defined]
    store.wait(["ncclscope-bench-never-set"])  # type: ignore[attr-defined]


def run_rank(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    rank, world = args.rank, args.world_size
    # The store lives in the launcher (as torchrun's agent holds it): any rank may die.
    store = dist.TCPStore(
        "127.0.0.1", int(os.environ["MASTER_PORT"]), world, is_master=False,
        timeout=timedelta(seconds=args.timeout_s),
    )  # fmt: skip
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout_s)
    )
    # Every rank must create a group; only the faulty rank ever uses it.
    side = dist.new_group(ranks=list(range(world)))
    say(
        event="ready",
        rank=rank,
        pid=os.getpid(),
        host=args.host_name,
        socket=os.environ.get("TORCH_WORKER_SERVER_SOCKET"),
        torch=torch.__version__,
    )
    t = torch.ones(256)
    step = 0
    while args.steps == 0 or step < args.steps:
        if rank == args.fault_rank and step == args.fault_step and args.fault != "none":
            say(event="fault", rank=rank, fault=args.fault, step=step)
            if args.fault == "python":
                stuck_in_python()
            elif args.fault == "collective":
                dist.all_reduce(t, group=side)
            else:
                os._exit(3)
        try:
            dist.all_reduce(t)
        except RuntimeError:
            if args.fault != "dead":
                raise
            say(event="peer_lost", rank=rank, step=step)
            wait_like_nccl(store, args.timeout_s)
            raise
        t.fill_(1.0)
        say(event="step", rank=rank, step=step)
        step += 1
        time.sleep(args.step_s)
    dist.destroy_process_group()


def launch(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, args.world_size + 1, is_master=True,
        timeout=timedelta(seconds=args.timeout_s), wait_for_workers=False,
    )  # fmt: skip
    port = store.port
    procs = []
    for rank in range(args.world_size):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(args.world_size),
            LOCAL_WORLD_SIZE=str(args.world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TORCH_FR_BUFFER_SIZE=env.get("TORCH_FR_BUFFER_SIZE", "2000"),
        )
        if args.socket_dir:
            env["TORCH_WORKER_SERVER_SOCKET"] = str(Path(args.socket_dir) / f"rank{rank}.sock")
        cmd = [sys.executable, __file__, "--rank", str(rank), *sys.argv[1:]]
        procs.append(subprocess.Popen(cmd, env=env))
    say(event="launched", pids=[p.pid for p in procs], launcher=os.getpid())
    try:
        return max(p.wait() for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--rank", type=int, default=None, help="(internal) run this rank")
    ap.add_argument("--steps", type=int, default=0, help="0: until killed")
    ap.add_argument("--step-s", type=float, default=0.05)
    ap.add_argument("--fault", choices=FAULTS, default="none")
    ap.add_argument("--fault-rank", type=int, default=1)
    ap.add_argument("--fault-step", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=600.0, help="gloo's collective timeout")
    ap.add_argument("--host-name", default=socket.gethostname(), help="label, to play nodes")
    ap.add_argument("--socket-dir", default=None, help="one worker-server socket per rank here")
    args = ap.parse_args()
    if args.rank is None:
        return launch(args)
    from torch.distributed.elastic.control_plane import worker_main

    # worker_main starts the worker server only where TORCH_WORKER_SERVER_SOCKET is set.
    with worker_main():
        run_rank(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
