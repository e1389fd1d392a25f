"""A real torch 2.x trainer pushing through the weightbeam vLLM backend: RANKS processes (gloo on
CPU), the model built by `transformers` from the checkpoint and sharded with FSDP2
``fully_shard``; each version is one AdamW step on a fixed batch, pushed with
``engine.send_weights()``. After each push rank 0 checks the engine itself: vLLM's prompt
log-probabilities for fixed prompts (over its HTTP API) against those of `transformers` running
the trainer's current weights (gathered with ``full_tensor()`` for the reference only), and
against the previous version's.

    trainer.py --model DIR --url http://127.0.0.1:PORT --controller ADDR --socket SOCK
               --ranks 2 --tp 1 --versions 3 [--first-version 1] [--delta] [--fail-agent-pid P]
               [--wrong-layout swap_qk_norm] [--report-dir DIR] --out result.json
"""

import argparse
import json
import os
import socket
import sys
import time

import requests
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PROMPTS = [[11, 42, 7, 300, 5, 99, 123, 250, 17, 8], [400, 3, 3, 77, 256, 12, 64, 31]]


def prompt_logprobs_engine(url, model, prompt):
    r = requests.post(f"{url}/v1/completions", json={
        "model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
        "prompt_logprobs": 0}, timeout=300)
    r.raise_for_status()
    entries = r.json()["choices"][0]["prompt_logprobs"]
    out = []
    for token, entry in zip(prompt[1:], entries[1:]):
        item = entry.get(str(token)) or entry.get(token)
        out.append(item["logprob"] if isinstance(item, dict) else float(item))
    return torch.tensor(out, dtype=torch.float64)


def prompt_logprobs_reference(model, prompt):
    with torch.no_grad():
        ids = torch.tensor([prompt])
        logits = model(input_ids=ids).logits.float()
        logp = torch.log_softmax(logits[0, :-1], dim=-1)
        return logp.gather(1, ids[0, 1:, None])[:, 0].double()


def build_model(path):
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16), config


def reference_model(path, full):
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(full, strict=False)
    assert not unexpected, unexpected
    assert all("lm_head" in m for m in missing), missing  # tied head only
    if missing:
        model.tie_weights()
    return model.eval()


def run(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(0)
    from torch.distributed.fsdp import fully_shard
    from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    import weightbeam.vllm_backend as wbv
    wbv.register()

    model, config = build_model(args.model)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    batch = torch.randint(0, config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(7))

    worker = {"agent_socket": args.worker_socket, "replica": 0, "report_dir": args.report_dir,
              "test_wrong_layout": args.wrong_layout}
    info = wbv.WeightbeamTrainerInitInfo(
        rank=rank, world=args.ranks, agent_socket=args.socket, controller=args.controller,
        replicas=1, ranks_per_replica=args.tp, worker=worker, delta=args.delta,
        first_version=args.first_version, step_timeout_s=args.step_timeout, digest=True)
    client = HTTPVLLMWeightSyncClient(args.url, timeout=600)
    source = wbv.DTensorShards(model, os.path.join(args.model, "config.json"))
    engine = WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)

    result = {"versions": [], "model": args.model, "tp": args.tp, "delta": bool(args.delta)}
    previous = None
    full = {n: p.full_tensor() for n, p in model.named_parameters()}  # reference only
    if rank == 0:
        previous = [prompt_logprobs_engine(args.url, args.served, p) for p in PROMPTS]
        if args.first_version == 1:  # the engine still serves the checkpoint
            ref = reference_model(args.model, full)
            base = max(float((a - prompt_logprobs_reference(ref, p)).abs().max())
                       for a, p in zip(previous, PROMPTS))
            result["checkpoint_max_abs_vs_transformers"] = base
            print(f"[trainer] checkpoint: |engine - transformers| {base:.4f}", flush=True)
    for i in range(args.versions):
        v = args.first_version + i
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        full = {n: p.full_tensor() for n, p in model.named_parameters()}  # reference only
        fail = args.fail_agent_pid and i == args.versions - 1
        if fail and rank == 0:
            os.kill(args.fail_agent_pid, 9)
        start = time.monotonic()
        try:
            engine.send_weights(v)
            error = None
        except Exception as e:
            error = str(e)
        seconds = time.monotonic() - start
        if rank != 0:
            continue
        engine_lp = [prompt_logprobs_engine(args.url, args.served, p) for p in PROMPTS]
        ref = reference_model(args.model, full)
        ref_lp = [prompt_logprobs_reference(ref, p) for p in PROMPTS]
        diff_ref = max(float((a - b).abs().max()) for a, b in zip(engine_lp, ref_lp))
        diff_prev = max(float((a - b).abs().max()) for a, b in zip(engine_lp, previous))
        result["versions"].append({"version": v, "error": error, "seconds": seconds,
                                   "max_abs_vs_transformers": diff_ref,
                                   "max_abs_vs_previous": diff_prev, "failed_on_purpose": bool(fail),
                                   "digest": engine.last_result.digest if error is None else ""})
        print(f"[trainer] version {v}: {'FAILED: ' + error if error else 'committed'} in "
              f"{seconds:.3f} s; |engine - transformers| {diff_ref:.4f}, "
              f"|engine - previous| {diff_prev:.4f}", flush=True)
        if error is None:
            previous = engine_lp
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    dist.barrier()
    try:
        engine.shutdown()
    except Exception as e:  # the agent killed on purpose
        print(f"[trainer] rank {rank}: shutdown: {e}", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--served", default="m")
    ap.add_argument("--url", required=True)
    ap.add_argument("--controller", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--worker-socket", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--first-version", type=int, default=1)
    ap.add_argument("--delta", action="store_true", default=None)
    ap.add_argument("--fail-agent-pid", type=int, default=0)
    ap.add_argument("--wrong-layout", default="")
    ap.add_argument("--report-dir", default="")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--step-timeout", type=float, default=60.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    sys.exit(main())
