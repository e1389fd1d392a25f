#!/usr/bin/env python3
"""A training loop that pushes every optimizer step into a running vLLM through weightbeam's
vLLM weight-transfer backend (docs/engines.md "vLLM backend").

The inference side is a plain vLLM server started with the backend (see vllm_serve.sh):

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL_DIR \\
        --weight-transfer-config '{"backend": "weightbeam"}'

This trainer runs RANKS processes (FSDP2 ``fully_shard`` on gloo, CPU; the same code runs on
CUDA with NCCL): each rank registers the shards it holds with its node's agent, rank 0 drives
vLLM's weight-sync routes through vLLM's own HTTPVLLMWeightSyncClient, and every step ends with
``engine.send_weights()``, which returns once every replica committed the version (or raises
weightbeam.StepFailed naming the agent, and vLLM keeps serving the previous version).

    python3 vllm_train_loop.py --model MODEL_DIR --url http://127.0.0.1:8000 \\
        --controller 127.0.0.1:7400 --socket /run/weightbeam/agent.sock --steps 3

Needs torch 2.x, transformers and vLLM (for its client classes) in the trainer's environment.
"""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM
    from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    import weightbeam.vllm_backend as wbv
    wbv.register()  # vLLM's plugin loader does this in vLLM's own processes

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)

    # The two weightbeam lines: the init info, and the model's shards as the source (a
    # Megatron-core GPTModel goes the same way: source=wbv.MegatronShards(model, config)).
    info = wbv.WeightbeamTrainerInitInfo(
        rank=rank, world=args.ranks, agent_socket=args.socket, controller=args.controller,
        replicas=1, ranks_per_replica=args.tp,
        worker={"agent_socket": args.worker_socket or args.socket})
    engine = WeightTransferTrainerFactory.trainer_init(
        info, client=HTTPVLLMWeightSyncClient(args.url),
        source=wbv.DTensorShards(model, os.path.join(args.model, "config.json")))

    tokens = torch.randint(0, model.config.vocab_size, (2, 32),
                           generator=torch.Generator().manual_seed(0))
    for step in range(1, args.steps + 1):
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        engine.send_weights()  # version = step; returns once vLLM serves it
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f}, vLLM serves version {engine.version}",
                  flush=True)
    engine.shutdown()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model directory")
    ap.add_argument("--url", required=True, help="the vLLM server")
    ap.add_argument("--controller", required=True, help="wb-controller host:port")
    ap.add_argument("--socket", required=True, help="this node's wb-agent socket")
    ap.add_argument("--worker-socket", default="",
                    help="the vLLM node's wb-agent socket (default: --socket's path)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tp", type=int, default=1, help="vLLM's tensor-parallel size")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(args, port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
