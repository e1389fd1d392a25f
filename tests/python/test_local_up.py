"""`./wb up`, then the two examples in two terminals, then `./wb down`, as a user would run them
(deploy/wb-local.sh, which ./wb up runs): the command lines `up` prints are run as printed (the
trainer with fewer, quicker steps), the inference worker sees every commit, and the checksum of
what it received matches what the trainer pushed; `wbctl trace` writes those steps as a valid
Chrome/Perfetto trace."""

import json
import os
import re
import shlex
import subprocess
import tempfile
import unittest

SRC = os.environ.get("WB_SRC_DIR", ".")
WB_LOCAL = os.path.join(SRC, "deploy/wb-local.sh")
STEPS = 3


def printed_command(output, script):
    """The command line `up` printed for `script`: (env, argv)."""
    for line in output.splitlines():
        if script in line:
            words = shlex.split(line)
            env = dict(os.environ)
            while words and "=" in words[0] and not words[0].startswith("/"):
                key, value = words.pop(0).split("=", 1)
                env[key] = value
            return env, words
    raise AssertionError(f"`up` printed no command line for {script}:\n{output}")


def check_trace(test, path, steps, agent_tracks):
    """`path` is a Trace Event Format JSON object (chrome://tracing, ui.perfetto.dev) with a
    controller track holding `steps` step spans and one named track per agent, spans nested."""
    with open(path) as f:
        trace = json.load(f)
    test.assertIsInstance(trace["traceEvents"], list)
    names, spans = {}, {}
    for e in trace["traceEvents"]:
        test.assertIsInstance(e["name"], str)
        test.assertIn(e["ph"], {"X", "M"})
        test.assertIsInstance(e["pid"], int)
        if e["ph"] == "M":
            if e["name"] == "thread_name":
                names[e["tid"]] = e["args"]["name"]
            continue
        test.assertIsInstance(e["tid"], int)
        test.assertGreaterEqual(e["dur"], 0)
        test.assertGreater(e["ts"], 0)
        spans.setdefault(e["tid"], []).append(e)
    test.assertEqual(set(names.values()), {"controller"} | agent_tracks)
    controller = [t for t, n in names.items() if n == "controller"][0]
    test.assertEqual(len(spans[controller]), steps)
    for tid, track in spans.items():
        test.assertIn(tid, names)
        track.sort(key=lambda e: e["ts"])
        ends = []
        for e in track:
            while ends and e["ts"] >= ends[-1] - 1e-6:
                ends.pop()
            if ends:
                test.assertLessEqual(e["ts"] + e["dur"], ends[-1] + 1e-6, e)
            ends.append(e["ts"] + e["dur"])


class LocalUpTest(unittest.TestCase):

    def test_up_then_both_examples_then_down(self):
        state = tempfile.mkdtemp(prefix="wb-up-", dir="/tmp")
        env = dict(os.environ, WB_UP_DIR=state)
        worker = None
        try:
            up = subprocess.run([WB_LOCAL, "up"], env=env, capture_output=True, text=True,
                                timeout=60)
            out = up.stdout + up.stderr
            self.assertEqual(up.returncode, 0, out)
            for name in ("controller", "train-0", "infer-0"):
                self.assertIn(os.path.join(state, f"{name}.log"), out)
            self.assertIn(os.path.join(state, "train-0.sock"), out)
            self.assertIn(os.path.join(state, "infer-0.sock"), out)

            # Terminal 1: the worker, as printed, stopping after the trainer's steps.
            wenv, wargv = printed_command(out, "inference_worker.py")
            worker = subprocess.Popen(wargv + ["--commits", str(STEPS), "--timeout", "120"],
                                      env=wenv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
            # Terminal 2: the trainer, as printed.
            tenv, targv = printed_command(out, "train_loop.py")
            trainer = subprocess.run(targv + ["--steps", str(STEPS), "--interval", "0.5"],
                                     env=tenv, capture_output=True, text=True, timeout=180)
            self.assertEqual(trainer.returncode, 0, trainer.stdout + trainer.stderr)
            wout, werr = worker.communicate(timeout=120)
            self.assertEqual(worker.returncode, 0, wout + werr)

            pushed = dict(re.findall(r"^step (\d+): .* sha256 ([0-9a-f]{64})$", trainer.stdout,
                                     re.M))
            seen = dict(re.findall(r"^commit (\d+): sha256 ([0-9a-f]{64}), checksum OK;", wout,
                                   re.M))
            versions = [str(v) for v in range(1, STEPS + 1)]
            self.assertEqual(sorted(pushed), versions, trainer.stdout)
            self.assertEqual(sorted(seen), versions, wout)
            self.assertEqual(seen, pushed)
            self.assertEqual(len(set(seen.values())), STEPS, "every version has new weights")
            self.assertNotIn("MISMATCH", wout)

            # The steps as a trace (wbctl trace): a track per agent that reports step timings
            # (the sender: receivers report none), the trace format's rules.
            with open(os.path.join(state, "env")) as f:
                controller = re.search(r"WB_CONTROLLER=(\S+)", f.read()).group(1)
            trace_file = os.path.join(state, "steps.json")
            run = subprocess.run([os.path.join(os.environ.get("WB_BIN_DIR", "bazel-bin"),
                                               "client/wbctl"), "trace", trace_file, "--last",
                                  str(STEPS), "--controller", controller],
                                 capture_output=True, text=True, timeout=30)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            check_trace(self, trace_file, STEPS, {"agent train-0"})
        finally:
            if worker and worker.poll() is None:
                worker.kill()
                worker.wait()
            down = subprocess.run([WB_LOCAL, "down"], env=env, capture_output=True, text=True,
                                  timeout=60)
        self.assertEqual(down.returncode, 0, down.stderr)
        self.assertIn("stopped 3 process(es)", down.stderr)
        self.assertFalse(os.path.exists(state), "down removes the state directory")


if __name__ == "__main__":
    unittest.main()
