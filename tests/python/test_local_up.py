"""`./wb up`, then the two examples in two terminals, then `./wb down`, as a user would run them
(deploy/wb-local.sh, which ./wb up runs): the command lines `up` prints are run as printed (the
trainer with fewer, quicker steps), the inference worker sees every commit, and the checksum of
what it received matches what the trainer pushed."""

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
