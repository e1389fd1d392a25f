#!/usr/bin/env python3
"""What a PyTorch training loop adds to push its weights to inference after every step.

    # once, after building the model:
    session = weightbeam.LocalSession(agent_socket, "trainer", rank=rank)
    for name, param in model.named_parameters():
        session.register(name, param.dtype, global_shape, shard=my_shard, buffer=param)
    ctl = weightbeam.ControllerClient(controller)   # rank 0 only
    ctl.plan(trainer_ranks=world_size, inference_replicas=R, inference_ranks_per_replica=TP)

    # after each optimizer.step():
    ctl.step(version)                               # raises weightbeam.StepFailed on failure
    # or, with a capture budget on the agents (capture.max_bytes), hold the loop only until
    # the step's bytes are copied, and collect the result later:
    handle = ctl.step_captured(version)             # weights may change once this returns
    ...; handle.result()                            # StepResult, or raises StepFailed

Host parameters must live in shared memory the agent can map: allocate a SharedBuffer and build
the tensors on it (``torch.frombuffer(buf.memoryview(off, n), dtype=torch.bfloat16)``), then copy
the model's weights in (or make them the parameters' storage). CUDA parameters are registered as
they are, through CUDA IPC (needs a CUDA build of wb-agent on the node).

Without torch this script runs the same loop with NumPy arrays standing in for BF16 parameters.
Run it against a running controller and agent, e.g.
  /usr/bin/python3 client/python/examples/train_loop.py --socket /run/weightbeam/agent.sock \
      --controller 127.0.0.1:7100 --steps 3
or on one machine after `./wb up` (which prints the command lines), next to
inference_worker.py: each step prints the SHA-256 of the weights it pushed, and with
--checksum-dir writes it there (v<version>.sha256) for the worker to check what it received.
"""

import argparse
import hashlib
import os
import time

import numpy as np

import weightbeam

try:
    import torch
except ImportError:  # NumPy stands in: BF16 values as uint16 bit patterns
    torch = None

# A toy model: name -> shape (all BF16 here).
SHAPES = {"embed.weight": (1024, 256), "layers.0.mlp.weight": (512, 256), "norm.weight": (256,)}


def nbytes(shape):
    return int(np.prod(shape)) * 2  # BF16


def make_parameters(buffer):
    """The model's parameters, placed in `buffer` (shared memory)."""
    params, offset = {}, 0
    for name, shape in SHAPES.items():
        if torch is not None:
            flat = torch.frombuffer(buffer.memoryview(offset, nbytes(shape)), dtype=torch.bfloat16)
            params[name] = flat.view(shape)
            params[name].normal_()
        else:
            params[name] = buffer.array(np.uint16, shape, offset)
            params[name][...] = np.random.default_rng(0).integers(0x3c00, 0x3f80, shape)
        offset += (nbytes(shape) + 63) // 64 * 64
    return params


def region(name):
    """(offset, bytes) of parameter `name` in the buffer: 64-byte aligned, in SHAPES order."""
    offset = 0
    for n, shape in SHAPES.items():
        if n == name:
            return offset, nbytes(shape)
        offset += (nbytes(shape) + 63) // 64 * 64
    raise KeyError(name)


def checksum(buffer):
    """SHA-256 of every parameter's bytes, in SHAPES order (inference_worker.py computes the
    same over what it received)."""
    h = hashlib.sha256()
    for name in SHAPES:
        h.update(buffer.memoryview(*region(name)))
    return h.hexdigest()


def optimizer_step(params, rng):
    """Stands in for loss.backward(); optimizer.step(): updates the weights in place."""
    for p in params.values():
        if torch is not None:
            with torch.no_grad():
                p.add_(torch.randn_like(p), alpha=1e-3)
        else:
            p[...] = rng.integers(0x3c00, 0x3f80, p.shape)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="this node's wb-agent socket")
    parser.add_argument("--controller", required=True, help="wb-controller host:port")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--trainer-ranks", type=int, default=1)
    parser.add_argument("--inference-replicas", type=int, default=1)
    parser.add_argument("--inference-tp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.0,
                        help="seconds between steps (time for a worker to look at each version)")
    parser.add_argument("--checksum-dir",
                        help="write each pushed version's checksum here (v<version>.sha256)")
    args = parser.parse_args()

    buffer = weightbeam.SharedBuffer(sum((nbytes(s) + 63) // 64 * 64 for s in SHAPES.values()),
                                     f"rank{args.rank}")
    params = make_parameters(buffer)

    # --- weightbeam: register once -------------------------------------------------------
    session = weightbeam.LocalSession(args.socket, "trainer", rank=args.rank)
    for name, p in params.items():
        session.register(name, "bf16", SHAPES[name], buffer=p)  # full tensors: no shard
    ctl = weightbeam.ControllerClient(args.controller)
    if args.rank == 0:
        plan = ctl.plan(args.trainer_ranks, args.inference_replicas, args.inference_tp, wait_s=60)
        print(f"plan {plan.plan_hash}: {plan.total_bytes} bytes in {plan.total_ops} ops")
    # --------------------------------------------------------------------------------------

    def report(version, digest, handle):
        """Waits for a step pushed earlier and prints its result."""
        try:
            result = handle.result(timeout=600)
            print(f"step {version}: {result.bytes} bytes in {result.seconds:.3f} s "
                  f"(trainer held {result.trainer_stall_seconds:.3f} s, {result.capture}), "
                  f"sha256 {digest}", flush=True)
        except weightbeam.StepFailed as e:
            print(f"step {version} not pushed: {e}")  # training goes on; next step retries

    rng = np.random.default_rng(1)
    pending = None  # (version, digest, handle) of the step still sending
    for version in range(1, args.steps + 1):
        if version > 1 and args.interval > 0:
            time.sleep(args.interval)
        optimizer_step(params, rng)
        digest = checksum(buffer)
        if args.checksum_dir and args.rank == 0:
            path = os.path.join(args.checksum_dir, f"v{version}.sha256")
            with open(path + ".tmp", "w") as f:
                f.write(digest + "\n")
            os.replace(path + ".tmp", path)
        # --- weightbeam: push this version. Rank 0 drives. With several ranks, all must have
        # finished their optimizer step before the step starts, and none may change its weights
        # until step_captured() returns: with a capture budget on the agents that is once every
        # sender has copied what it sends (the step then sends while training goes on), without
        # one at the step's end (agents read registered memory in place). A barrier on each
        # side, e.g. torch.distributed.barrier(). --------------------------------------------
        if args.rank == 0:
            try:
                handle = ctl.step_captured(version)
            except weightbeam.StepFailed as e:
                print(f"step {version} not pushed: {e}")  # training goes on; next step retries
                handle = None
            if pending is not None:
                report(*pending)
            pending = (version, digest, handle) if handle is not None else None
    if pending is not None:
        report(*pending)

    session.close()
    buffer.close()


if __name__ == "__main__":
    main()
