#!/usr/bin/env python3
"""What an inference worker adds to receive its weights from training after every step.

    # once, after building the model on shared memory:
    session = weightbeam.LocalSession(agent_socket, "inference", rank=tp_rank, replica=replica)
    for name, param in model.named_parameters():
        session.register(name, param.dtype, global_shape, shard=my_shard, buffer=param)
    session.watch()

    # then, between batches:
    event = session.next_event(timeout=0)         # None: nothing new
    if event and event.kind == "commit":          # version event.version is in place
        ...

The agent writes new weights straight into the registered memory while a step runs ("begin"),
and "commit" says the version is complete on every worker; an engine stops reading the weights
between the two (or double-buffers). With the agent's `receive.mode: staged` the bytes land in
staging memory instead and "begin" comes only when all of them are there: the live tensors
change in one local copy before "commit". With --ack this worker acknowledges each "begin"
(`session.watch(ack=True)`, `session.ack(version)`), as an engine does once it has paused: the
agent's copy waits for that. Host tensors live in a SharedBuffer, as in train_loop.py.

This worker holds the same toy model as train_loop.py, prints each commit with the SHA-256 of
the weights it received and, with --checksum-dir (where train_loop.py writes v<version>.sha256),
checks it against the trainer's. After `./wb up` (which prints both command lines):
  /usr/bin/python3 client/python/examples/inference_worker.py --socket .../infer-0.sock \\
      --checksum-dir .cache/up
Without torch, NumPy arrays stand in for the BF16 tensors. Exit status: 0, or 1 when a checksum
did not match or no event came within --timeout.
"""

import argparse
import hashlib
import os
import sys

import numpy as np

import weightbeam

try:
    import torch
except ImportError:  # NumPy stands in: BF16 values as uint16 bit patterns
    torch = None

# The same toy model as train_loop.py: name -> shape (all BF16).
SHAPES = {"embed.weight": (1024, 256), "layers.0.mlp.weight": (512, 256), "norm.weight": (256,)}


def nbytes(shape):
    return int(np.prod(shape)) * 2  # BF16


def region(name):
    """(offset, bytes) of parameter `name` in the buffer: 64-byte aligned, in SHAPES order."""
    offset = 0
    for n, shape in SHAPES.items():
        if n == name:
            return offset, nbytes(shape)
        offset += (nbytes(shape) + 63) // 64 * 64
    raise KeyError(name)


def make_parameters(buffer):
    """The model's parameters on `buffer` (shared memory), zero until the first commit."""
    params = {}
    for name, shape in SHAPES.items():
        offset, n = region(name)
        if torch is not None:
            params[name] = torch.frombuffer(buffer.memoryview(offset, n),
                                            dtype=torch.bfloat16).view(shape)
        else:
            params[name] = buffer.array(np.uint16, shape, offset)
    return params


def checksum(buffer):
    """SHA-256 of every parameter's bytes, in SHAPES order (as train_loop.py computes it)."""
    h = hashlib.sha256()
    for name in SHAPES:
        h.update(buffer.memoryview(*region(name)))
    return h.hexdigest()


def expected(checksum_dir, version):
    try:
        with open(os.path.join(checksum_dir, f"v{version}.sha256")) as f:
            return f.read().strip()
    except OSError:
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="this node's wb-agent socket")
    parser.add_argument("--replica", type=int, default=0)
    parser.add_argument("--rank", type=int, default=0, help="tensor-parallel rank")
    parser.add_argument("--commits", type=int, default=0, help="stop after this many (0: never)")
    parser.add_argument("--timeout", type=float, default=0,
                        help="give up after this many seconds without an event (0: never)")
    parser.add_argument("--checksum-dir", help="where train_loop.py writes v<version>.sha256")
    parser.add_argument("--ack", action="store_true",
                        help="acknowledge each begin (the staged agent's swap waits for it)")
    args = parser.parse_args()

    size = sum((nbytes(s) + 63) // 64 * 64 for s in SHAPES.values())
    buffer = weightbeam.SharedBuffer(size, f"worker{args.replica}-{args.rank}")
    params = make_parameters(buffer)

    # --- weightbeam: register once, then watch ----------------------------------------------
    session = weightbeam.LocalSession(args.socket, "inference", rank=args.rank,
                                      replica=args.replica)
    for name, p in params.items():
        session.register(name, "bf16", SHAPES[name], buffer=p)  # full tensors: no shard
    session.watch(ack=args.ack)
    # ------------------------------------------------------------------------------------------
    print(f"replica {args.replica} rank {args.rank}: {len(params)} tensors ({size} bytes) "
          f"registered with {args.socket}; waiting for commits", flush=True)

    commits = mismatches = 0
    try:
        while args.commits == 0 or commits < args.commits:
            event = session.next_event(timeout=args.timeout or None)
            if event is None:
                print(f"no event in {args.timeout} s", file=sys.stderr)
                return 1
            if event.kind == "abort":
                print(f"version {event.version} aborted: {event.reason}", flush=True)
                continue
            if event.kind == "begin" and args.ack:
                # An engine pauses here (stops reading the weights), then says so.
                session.ack(event.version)
                continue
            if event.kind != "commit":
                continue
            commits += 1
            digest = checksum(buffer)
            first = params["norm.weight"][:3]
            first = [float(x) for x in first] if torch is not None else [hex(x) for x in first]
            verdict = ""
            if args.checksum_dir:
                want = expected(args.checksum_dir, event.version)
                if want is None:
                    verdict = ", no checksum from the trainer"
                elif want == digest:
                    verdict = ", checksum OK"
                else:
                    mismatches += 1
                    verdict = f", checksum MISMATCH (the trainer pushed {want})"
            print(f"commit {event.version}: sha256 {digest}{verdict}; norm.weight[:3] = {first}",
                  flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        session.close()
        buffer.close()
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
