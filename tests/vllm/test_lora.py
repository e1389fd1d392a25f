"""LoRA adapters into a real vLLM (docs/clients.md "LoRA adapters"), run by suite.py (case
"lora"). A PEFT LoRA on every linear of the tiny Qwen3 (q, k, v, o, gate, up, down; r 8,
random nonzero A and B) goes trainer LocalSession -> wb-agent -> controller step -> wb-agent ->
AdapterSlot, which loads it into a real vLLM ``LLM(enable_lora=True)`` in this process through
vLLM's add_lora. Checked, in float32 on both sides:

* the next-token log-probabilities (the whole vocabulary, at every prefix of two prompts) with
  the adapter equal those of `transformers` + PEFT holding the trainer's adapter weights;
* without the adapter they equal the base model's, before and after (base weights untouched);
* version 2 replaces version 1;
* a load that fails (a corrupt adapter_config.json) keeps the previous adapter: at commit
  (plan without checks: the slot says why) and before it (``check=True`` with a user-check
  plan: the step raises naming vLLM's error, and no replica commits).

    test_lora.py --checkpoints DIR [--keep]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

# In-process engine core: the slot's add_lora and the test's generate share one LLM object.
# Its log goes to this process's output (./wb test's): warnings only.
os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1",
                  VLLM_CPU_OMP_THREADS_BIND="nobind", TOKENIZERS_PARALLELISM="false",
                  VLLM_LOGGING_LEVEL="WARNING")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from cluster import Cluster  # noqa: E402

import weightbeam  # noqa: E402
from weightbeam import lora  # noqa: E402

PROMPTS = [[11, 42, 7, 300, 5, 99, 123, 250, 17, 8], [400, 3, 3, 77, 256, 12, 64, 31]]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STAGED = "receive:\n  mode: staged\n  ack_timeout_ms: 30000\n"
# float32 weights and activations on both sides; vLLM's CPU kernels and torch's sum in other
# orders: measured up to ~1e-6 nats. An adapter moves them by ~1 nat, so each comparison below
# that must differ asks for 1000x the tolerance.
TOLERANCE = 1e-4
CORRUPT = "{not json"


def log(msg):
    print(f"[lora] {msg}", flush=True)


class Reference:
    """The trainer's PEFT model in float32: its adapter is what gets pushed."""

    def __init__(self, model_dir):
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        config = LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, lora_dropout=0.0)
        self.model = get_peft_model(base, config).eval()
        self.tensors, self.config = lora.peft_adapter(self.model)

    def randomize(self, seed):
        """New nonzero A and B (PEFT starts B at zero: the adapter would do nothing)."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if "lora_" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)

    def logprobs(self, adapter=True):
        out = []
        with torch.no_grad():
            for p in PROMPTS:
                ids = torch.tensor([p[:-1]])
                if adapter:
                    logits = self.model(input_ids=ids).logits
                else:
                    with self.model.disable_adapter():
                        logits = self.model(input_ids=ids).logits
                out.append(torch.log_softmax(logits[0].double(), dim=-1))
        return out


class Engine:
    """vLLM's CPU build in this process, LoRA on, float32."""

    def __init__(self, model_dir, vocab):
        from vllm import LLM, SamplingParams
        self.vocab = vocab
        self.llm = LLM(model_dir, dtype="float32", enforce_eager=True, max_model_len=256,
                       max_num_seqs=4, enable_prefix_caching=False, enable_lora=True,
                       max_lora_rank=8, max_loras=1, max_cpu_loras=3, max_logprobs=vocab)
        self.params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=vocab)

    def logprobs(self, lora_request, lock):
        """The whole next-token distribution after every prefix, one request per prefix: with
        LoRA on, vLLM 0.32's CPU build fails prompt log-probs of two requests in one batch
        (docs/clients.md, "LoRA adapters")."""
        out = []
        for p in PROMPTS:
            prefixes = [{"prompt_token_ids": p[:i]} for i in range(1, len(p))]
            with lock:
                outs = self.llm.generate(prefixes, self.params, lora_request=lora_request,
                                         use_tqdm=False)
            rows = [[o.outputs[0].logprobs[0][t].logprob for t in range(self.vocab)]
                    for o in outs]
            out.append(torch.tensor(rows, dtype=torch.float64))
        return out


def max_diff(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


class Run:
    """Collects the measurements and what went wrong."""

    def __init__(self, ref, engine):
        self.ref, self.engine, self.problems, self.worst = ref, engine, [], 0.0
        self.base = ref.logprobs(adapter=False)

    def expect(self, ok, what):
        if not ok:
            self.problems.append(what)
            log(f"PROBLEM: {what}")

    def check_serves(self, slot, label, expected):
        """The engine with the slot's active adapter serves ``expected`` (reference log-probs);
        without the adapter, the base model."""
        got = self.engine.logprobs(slot.active, slot.lock)
        d = max_diff(got, expected)
        self.worst = max(self.worst, d)
        moved = max_diff(got, self.base)
        base_d = max_diff(self.engine.logprobs(None, slot.lock), self.base)
        log(f"{label}: |vLLM + adapter - transformers + PEFT| {d:.2e}, vs base {moved:.3f}; "
            f"|vLLM without adapter - base| {base_d:.2e}")
        self.expect(d <= TOLERANCE, f"{label}: log-probs differ from PEFT's by {d:.2e}")
        self.expect(moved >= 1000 * TOLERANCE, f"{label}: the adapter moved nothing ({moved})")
        self.expect(base_d <= TOLERANCE, f"{label}: the base model changed ({base_d:.2e})")
        return got


class Fleet:
    """Real daemons: a trainer node (the adapter source) and a staged inference node (the
    slot), planned for one trainer rank and one replica of one rank."""

    def __init__(self, ref, engine, model_dir, workdir, name, check, id_offset):
        self.cluster = Cluster(["train", "infer"], trainer_ranks=1, inference_replicas=1,
                               controller_yaml="step_timeout_ms: 60000\n",
                               agent_yaml=lambda n: STAGED if n == "infer" else "")
        self.trainer = weightbeam.LocalSession(self.cluster.sockets["train"], "trainer", rank=0)
        self.source = lora.AdapterSource(self.trainer, ref.tensors)
        specs = lora.adapter_specs(ref.config, os.path.join(model_dir, "config.json"))
        self.inference = weightbeam.LocalSession(self.cluster.sockets["infer"], "inference")
        self.slot = lora.AdapterSlot(self.inference, specs, ref.config,
                                     lora.VllmAdapterLoader(engine.llm), workdir, name=name,
                                     check=check, id_offset=id_offset)
        self.ctl = weightbeam.ControllerClient(self.cluster.controller_address)
        self.ctl.plan(1, 1, 1, wait_s=30, user_check=check)

    def push(self, version):
        self.source.copy()
        start = time.monotonic()
        try:
            self.ctl.step(version)
            return None, time.monotonic() - start
        except weightbeam.StepFailed as e:
            return str(e), time.monotonic() - start

    def close(self):
        self.slot.close()
        for c in (self.ctl, self.inference, self.trainer):
            c.close()
        self.source.close()
        self.cluster.stop()


def phase_at_commit(run, ref, engine, model_dir, workdir):
    """Plan without checks: the slot loads each committed version; a failed load keeps the
    previous adapter active and says why."""
    f = Fleet(ref, engine, model_dir, workdir, "adapter", check=False, id_offset=0)
    try:
        served = {}
        for v, seed in ((1, 101), (2, 102)):
            ref.randomize(seed)
            error, seconds = f.push(v)
            run.expect(error is None, f"at commit: version {v} failed: {error}")
            run.expect(f.slot.wait(v, 60), f"at commit: version {v} never became active")
            log(f"at commit: version {v} pushed in {seconds:.3f} s, then written and loaded "
                f"into vLLM in {f.slot.load_seconds:.3f} s")
            served[v] = run.check_serves(f.slot, f"at commit, version {v}", ref.logprobs())
        run.expect(max_diff(served[1], served[2]) >= 1000 * TOLERANCE,
                   "at commit: version 2 serves what version 1 did")
        f.slot._config_text = lambda: CORRUPT  # the next version's adapter_config.json
        ref.randomize(103)
        error, _ = f.push(3)
        run.expect(error is None, f"at commit: version 3 (committed, then refused by the "
                                  f"engine) failed its step: {error}")
        try:
            f.slot.wait(3, 60)
            run.expect(False, "at commit: the corrupt version 3 became active")
        except weightbeam.WeightbeamError as e:
            log(f"at commit: version 3 refused: {e}")
            run.expect("JSONDecodeError" in str(e) and "keeps version 2" in str(e),
                       f"at commit: the refusal does not say why: {e}")
        run.expect(f.slot.version == 2, f"at commit: the slot serves {f.slot.version}, not 2")
        ref.randomize(102)  # version 2's weights again, for the reference
        run.check_serves(f.slot, "at commit, after the failed version 3", ref.logprobs())
    finally:
        f.close()


def phase_checked(run, ref, engine, model_dir, workdir):
    """A user-check plan: the slot loads each staged version before the commit; a failed load
    refuses the version on every replica and the step raises naming vLLM's error."""
    f = Fleet(ref, engine, model_dir, workdir, "checked", check=True, id_offset=1000)
    try:
        ref.randomize(201)
        error, seconds = f.push(1)
        run.expect(error is None, f"checked: version 1 failed: {error}")
        run.expect(f.slot.wait(1, 60), "checked: version 1 never became active")
        log(f"checked: version 1 pushed in {seconds:.3f} s (the slot's write + vLLM load before "
            f"the commit: {f.slot.load_seconds:.3f} s)")
        run.check_serves(f.slot, "checked, version 1", ref.logprobs())
        def refused(version, what, config_text, needle):
            """A version whose adapter config the check refuses: its step fails naming why and
            the slot keeps serving version 1."""
            f.slot._config_text = lambda: config_text
            ref.randomize(200 + version)
            error, _ = f.push(version)
            log(f"checked: version {version} ({what}): {error}")
            run.expect(error is not None and needle in error,
                       f"checked: version {version} ({what}) did not fail its step naming why: "
                       f"{error}")
            run.expect(f.slot.version == 1, f"checked: the slot serves {f.slot.version}, not 1")

        refused(2, "corrupt config", CORRUPT, "JSONDecodeError")
        ref.randomize(201)
        run.check_serves(f.slot, "checked, after the refused version 2", ref.logprobs())
        # A config vLLM refuses on its own terms: rank 16 above the engine's max_lora_rank 8.
        refused(3, "r 16 > max_lora_rank 8", json.dumps(dict(ref.config, r=16)), "max_lora_rank")
        del f.slot._config_text
        ref.randomize(204)
        error, _ = f.push(4)
        run.expect(error is None and f.slot.wait(4, 60), f"checked: version 4 failed: {error}")
        run.check_serves(f.slot, "checked, version 4", ref.logprobs())
    finally:
        f.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoints", required=True)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    start = time.monotonic()
    model_dir = os.path.join(args.checkpoints, "qwen3")
    with open(os.path.join(model_dir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    ref = Reference(model_dir)
    specs = lora.adapter_specs(ref.config, os.path.join(model_dir, "config.json"))
    held = {n: (tuple(t.shape), "f32") for n, t in ref.tensors().items()}
    engine = Engine(model_dir, vocab)
    run = Run(ref, engine)
    run.expect(specs == held, "adapter_specs disagrees with PEFT's tensors: "
                              f"{sorted(set(specs) ^ set(held))[:4]}")
    log(f"{len(held)} adapter tensors ({sum(4 * t.numel() for t in ref.tensors().values())} "
        f"bytes), engine up after {time.monotonic() - start:.0f} s")
    base_d = max_diff(engine.logprobs(None, _NoLock()), run.base)
    log(f"before any adapter: |vLLM - transformers| {base_d:.2e}")
    run.expect(base_d <= TOLERANCE, f"the base model differs from transformers' by {base_d}")
    workdir = tempfile.mkdtemp(prefix="wb-lora-", dir="/tmp")
    try:
        phase_at_commit(run, ref, engine, model_dir, workdir)
        phase_checked(run, ref, engine, model_dir, workdir)
    finally:
        if args.keep or run.problems:
            log(f"adapter directories kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    log(f"max |vLLM + adapter - transformers + PEFT| over every check: {run.worst:.2e} "
        f"(tolerance {TOLERANCE:g}, float32)")
    for p in run.problems:
        log(f"FAIL: {p}")
    return 1 if run.problems else 0


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
