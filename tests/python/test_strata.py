"""The Python module end to end: a zoo MLP loaded, compiled, inspected, run and
trained, each checked against the strata CLI on the same files (byte-identical
models and plans, the same inspect JSON, the same losses and bitwise the same
weights after training); inputs read in place and outputs handed over without
a copy; errors that name the file; PyTorch in and out: a transformer's and a
ResNet's outputs, training beside PyTorch's, a shuffled DataLoader resumed
from a checkpoint, a checkpoint exported as .safetensors loaded into a fresh
module (skipped, saying so, without torch).

Run under pytest by `meson test --suite python`, which sets PYTHONPATH to
build/python and STRATA_BINARY to the CLI; `python3 test_strata.py` (unittest)
works too.
"""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import unittest.mock

import numpy as np

import strata

STRATA = os.environ.get("STRATA_BINARY", "")

try:
    import torch
except ImportError:  # the PyTorch cases skip
    torch = None

NO_TORCH = "no PyTorch for " + sys.executable + " (apt install python3-torch)"

# The zoo MLP of these tests: x f32[8, 12] -> 16 -> logits f32[8, 4].
MLP = {"batch": 8, "input": 12, "hidden": [16], "classes": 4}


def aligned(shape, dtype=np.float32):
    """An uninitialized C-contiguous array whose data starts 64-byte aligned."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + 64, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw[offset:offset + size].view(dtype).reshape(shape)


def cli(*args):
    """Runs the strata CLI; returns its stdout, failing the test on an error."""
    done = subprocess.run([STRATA, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"strata {' '.join(args)} failed: {done.stderr}")
    return done.stdout


def cli_losses(output):
    """The losses `strata run` printed, by step."""
    return [float(m.group(1)) for m in re.finditer(r"^step \d+/\d+\s+loss (\S+)", output, re.M)]


def read_safetensors(path):
    """A .safetensors file as (metadata, {name: array}): the 8-byte little-endian
    header length, the JSON header, the data; no safetensors package needed."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    dtypes = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64,
              "BOOL": np.bool_}
    start = 8 + length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        array = np.frombuffer(data[start + begin:start + end], dtype=dtypes[entry["dtype"]])
        tensors[name] = array.reshape(entry["shape"])
    return header.get("__metadata__", {}), tensors


def batches(count, seed=1):
    """`count` batches of the MLP's training plan: x f32[8, 12], labels i64[8]."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, MLP["batch"], MLP["input"])).astype(np.float32)
    labels = rng.integers(0, MLP["classes"], (count, MLP["batch"])).astype(np.int64)
    return x, labels


class StrataTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="strata-python-test-")
        cls.mlp = cls.path("mlp.strata")
        strata.zoo.mlp(**MLP).save(cls.mlp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    def need_cli(self):
        if not STRATA or not os.access(STRATA, os.X_OK):
            self.skipTest("no strata CLI (STRATA_BINARY) to compare with")

    def pipeline_plan(self, name):
        """The MLP's training step on a 2-stage pipeline of 2 micro-batches."""
        plan = strata.load(self.mlp).compile(train=True, optimizer="sgd:lr=0.1",
                                             mesh="1x1x2", microbatches=2)
        plan.save(self.path(name))
        return plan

    # -- models and plans, as the CLI makes and reads them ------------------

    def test_zoo_model_is_the_clis(self):
        self.need_cli()
        cli("zoo", "mlp", "--batch", "8", "--input", "12", "--hidden", "16", "--classes", "4",
            "-o", self.path("cli_mlp.strata"))
        with open(self.mlp, "rb") as ours, open(self.path("cli_mlp.strata"), "rb") as theirs:
            self.assertEqual(ours.read(), theirs.read())

    def test_load_and_inspect_a_model(self):
        model = strata.load(self.mlp)
        self.assertIsInstance(model, strata.Model)
        self.assertEqual(model.source, self.mlp)
        self.assertEqual([(i["name"], i["dtype"], i["shape"]) for i in model.inputs],
                         [("x", "f32", (8, 12))])
        self.assertEqual(model.parameters, 12 * 16 + 16 + 16 * 4 + 4)
        report = model.inspect()
        self.assertEqual(report["parameters"], model.parameters)
        if STRATA:
            self.assertEqual(report, json.loads(cli("inspect", self.mlp, "--format", "json")))

    def test_compiled_plan_is_the_clis(self):
        self.need_cli()
        plan = self.pipeline_plan("py.splan")
        cli("compile", self.mlp, "--train", "--optimizer", "sgd:lr=0.1", "--mesh", "1x1x2",
            "--microbatches", "2", "-o", self.path("cli.splan"))
        with open(self.path("py.splan"), "rb") as ours, open(self.path("cli.splan"), "rb") as cl:
            self.assertEqual(ours.read(), cl.read())
        self.assertEqual(plan.to_json(),
                         json.loads(cli("inspect", self.path("cli.splan"), "--format", "json")))
        loaded = strata.load(self.path("cli.splan"))
        self.assertIsInstance(loaded, strata.Plan)
        self.assertEqual(loaded.fingerprint, plan.fingerprint)

    def test_inspect_gives_stages_memory_times_and_transfers(self):
        plan = self.pipeline_plan("inspect.splan")
        report = plan.inspect()
        self.assertEqual(report["mode"], "train")
        self.assertEqual(report["fingerprint"], plan.fingerprint)
        self.assertEqual(report["optimizer"], plan.optimizer)
        self.assertEqual(report["pipeline"]["stages"], 2)
        self.assertEqual(report["pipeline"]["microbatches"], 2)
        self.assertGreater(report["pipeline"]["predicted_step_s"], 0)
        self.assertEqual([(b["name"], b["shape"]) for b in report["batch"]],
                         [("x", [8, 12]), ("labels", [8])])
        self.assertEqual(len(report["stages"]), 2)
        for stage in report["stages"]:
            self.assertGreater(stage["nodes"], 0)
            self.assertGreater(stage["arena_bytes"], 0)
            self.assertGreater(stage["predicted_busy_s"], 0)
        transfers = report["transfers"]
        self.assertTrue(transfers)
        for transfer in transfers:
            self.assertIn(transfer["from"], (0, 1))
            self.assertIn(transfer["to"], (0, 1))
            self.assertGreater(transfer["bytes"], 0)
            self.assertTrue(transfer["why"])
        if STRATA:
            text = cli("inspect", self.path("inspect.splan"), "--comm")
            count = int(re.search(r"^transfers\s+(\d+)", text, re.M).group(1))
            self.assertEqual(count, len(transfers))
            # The same facts, field for field, as the CLI's report of the file.
            self.assertEqual(strata.load(self.path("inspect.splan")).inspect(),
                             json.loads(cli("inspect", self.path("inspect.splan"), "--format",
                                            "report")))

    # -- running: NumPy in and out -------------------------------------------

    def test_run_reads_aligned_inputs_in_place_and_hands_outputs_over(self):
        plan = strata.load(self.mlp).compile()
        self.assertEqual(plan.mode, "infer")
        x = aligned((8, 12))
        x[...] = np.random.default_rng(0).standard_normal((8, 12))
        copied = strata._strata._input_bytes_copied()
        out = plan.run({"x": x})
        self.assertEqual(strata._strata._input_bytes_copied(), copied, "an aligned input was copied")
        self.assertEqual(list(out), [o["name"] for o in plan.outputs])
        logits = out[plan.outputs[0]["name"]]
        self.assertEqual((logits.shape, logits.dtype), ((8, 4), np.float32))
        self.assertFalse(logits.flags.owndata)  # a view of strata's buffer
        self.assertIsNotNone(logits.base)
        # Column-major and float64: converted, so copied once.
        again = plan.run([np.asfortranarray(x.astype(np.float64))])[plan.outputs[0]["name"]]
        self.assertEqual(strata._strata._input_bytes_copied(), copied + x.nbytes)
        np.testing.assert_array_equal(again, logits)
        if STRATA:
            np.save(self.path("x.npy"), x)
            cli("run", self.mlp, "--input", "x=" + self.path("x.npy"), "--output",
                self.path("y.npy"))
            np.testing.assert_array_equal(np.load(self.path("y.npy")), logits)

    def test_model_runs_random_inputs_by_seed(self):
        model = strata.load(self.mlp)
        name = model.outputs[0]["name"]
        a = model.run(seed=3)[name]
        np.testing.assert_array_equal(a, model.run(seed=3)[name])
        self.assertFalse(np.array_equal(a, model.run(seed=4)[name]))

    # -- training --------------------------------------------------------------

    def test_training_matches_strata_run_on_the_same_plan_and_data(self):
        self.need_cli()
        plan = self.pipeline_plan("train.splan")
        x, labels = batches(3)
        data = self.path("data")
        os.makedirs(data, exist_ok=True)
        np.save(os.path.join(data, "x.npy"), x)
        np.save(os.path.join(data, "labels.npy"), labels)
        printed = cli("run", self.path("train.splan"), "--steps", "3", "--data", data,
                      "--checkpoint", self.path("ck_cli"))
        with plan.trainer(checkpoint=self.path("ck_py")) as trainer:
            losses = [trainer.step((x[k], labels[k])) for k in range(3)]
            self.assertEqual(trainer.step_count, 3)
        self.assertEqual(len(cli_losses(printed)), 3)
        for ours, theirs in zip(losses, cli_losses(printed)):
            self.assertAlmostEqual(ours, theirs, delta=6e-5)  # the CLI prints 4 decimals
        ours = strata.read_checkpoint(self.path("ck_py"))
        theirs = strata.read_checkpoint(self.path("ck_cli"))
        self.assertEqual((ours["step"], ours["fingerprint"]), (3, plan.fingerprint))
        self.assertEqual(ours["fingerprint"], theirs["fingerprint"])
        for key in ("layout", "model", "optimizer"):
            self.assertEqual(ours[key], theirs[key])
        self.assertEqual(ours["optimizer"], plan.optimizer)
        self.assertEqual(sorted(ours["tensors"]), sorted(theirs["tensors"]))
        for name, value in ours["tensors"].items():
            np.testing.assert_array_equal(value, theirs["tensors"][name], err_msg=name)

    def test_own_batches_are_the_clis_synthetic_ones(self):
        self.need_cli()
        plan = self.pipeline_plan("synthetic.splan")
        printed = cli("run", self.path("synthetic.splan"), "--steps", "4")
        with plan.trainer() as trainer:
            self.assertEqual(trainer.num_batches, 8)
            losses = trainer.fit(steps=4)
        for ours, theirs in zip(losses, cli_losses(printed)):
            self.assertAlmostEqual(ours, theirs, delta=6e-5)

    def test_weights_state_and_aligned_batches_in_place(self):
        plan = strata.load(self.mlp).compile(train=True, optimizer="adam:lr=0.01")
        x, labels = batches(1)
        xa, la = aligned((8, 12)), aligned((8,), np.int64)
        xa[...], la[...] = x[0], labels[0]
        with plan.trainer() as trainer:
            before = trainer.weights()
            copied = strata._strata._input_bytes_copied()
            trainer.step({"x": xa, "labels": la})
            self.assertEqual(strata._strata._input_bytes_copied(), copied)
            after = trainer.weights()
            state = trainer.state()
        self.assertEqual(sorted(before), ["fc0.bias", "fc0.weight", "head.bias", "head.weight"])
        self.assertTrue(any(not np.array_equal(before[k], after[k]) for k in before))
        self.assertTrue(set(after) < set(state))  # plus the optimizer's moments and step
        self.assertIn("optimizer.step", state)

    def test_integer_inputs_convert_only_the_values_that_fit(self):
        plan = strata.load(self.mlp).compile(train=True, optimizer="sgd:lr=0.1")
        x, labels = batches(1, seed=8)
        with plan.trainer() as trainer:
            with self.assertRaisesRegex(strata.InvalidArgumentError, "input 'labels'.*float64"):
                trainer.step((x[0], labels[0].astype(np.float64)))
            # -100 is the loss's ignore_index: a wrapped value that would pass.
            wrapping = np.full(labels[0].shape, 2**64 - 100, np.uint64)
            with self.assertRaisesRegex(strata.InvalidArgumentError,
                                        "input 'labels'.*uint64.*18446744073709551516"):
                trainer.step((x[0], wrapping))
            self.assertEqual(trainer.step_count, 0)
            narrow = trainer.step((x[0], labels[0].astype(np.int32)))
            small = trainer.step((x[0], labels[0].astype(np.uint64)))
        with plan.trainer() as reference:
            self.assertEqual([reference.step((x[0], labels[0])) for _ in range(2)], [narrow, small])

    def test_resume_continues_bitwise(self):
        plan = self.pipeline_plan("resume.splan")
        x, labels = batches(4, seed=2)
        with plan.trainer() as straight:
            expected = [straight.step((x[k], labels[k])) for k in range(4)]
        ck = self.path("ck_resume")
        with plan.trainer(checkpoint=ck) as first:
            first.fit(zip(x[:2], labels[:2]))
        self.assertEqual(strata.read_checkpoint(ck)["step"], 2)
        with plan.trainer(checkpoint=ck, resume=ck) as second:
            self.assertEqual(second.step_count, 2)
            rest = second.fit(zip(x[2:], labels[2:]))
        self.assertEqual(rest, expected[2:])

    def test_zero_three_prefetches_by_default_with_the_same_losses(self):
        model = strata.load(self.mlp)
        kinds = {}
        losses = {}
        x, labels = batches(3, seed=4)
        for prefetch in (True, False):
            plan = model.compile(train=True, optimizer="adamw:lr=0.01", mesh="2x1x1",
                                 microbatches=2, zero=3, prefetch=prefetch)
            kinds[prefetch] = {instr["kind"] for program in plan.to_json()["programs"]
                               for instr in program["instructions"]}
            with plan.trainer() as trainer:
                losses[prefetch] = [trainer.step((x[k], labels[k])) for k in range(3)]
        self.assertIn("StartGather", kinds[True])
        self.assertNotIn("GatherParam", kinds[True])
        self.assertIn("GatherParam", kinds[False])
        self.assertEqual(losses[True], losses[False])

    def test_zero_bubble_schedule_has_the_losses_of_1f1b(self):
        model = strata.load(self.mlp)
        x, labels = batches(3, seed=5)
        losses = {}
        for schedule in ("1f1b", "zb-h1"):
            plan = model.compile(train=True, optimizer="adamw:lr=0.01", mesh="1x1x2",
                                 microbatches=2, schedule=schedule)
            self.assertEqual(plan.to_json()["pipeline"]["schedule"], schedule)
            with plan.trainer() as trainer:
                losses[schedule] = [trainer.step((x[k], labels[k])) for k in range(3)]
        self.assertEqual(losses["1f1b"], losses["zb-h1"])

    def test_fit_with_steps_leaves_the_next_batch_in_the_iterator(self):
        plan = strata.load(self.mlp).compile(train=True, optimizer="sgd:lr=0.1")
        x, labels = batches(4, seed=6)
        with plan.trainer() as single:
            expected = [single.step((x[k], labels[k])) for k in range(4)]
        with plan.trainer() as trainer:
            it = iter(zip(x, labels))
            self.assertEqual(trainer.fit(it, steps=0), [])
            losses = trainer.fit(it, steps=2) + trainer.fit(it, steps=2)
            self.assertEqual(trainer.step_count, 4)
        self.assertEqual(losses, expected)

    def test_fit_refuses_a_skip_that_leaves_nothing_to_train(self):
        plan = strata.load(self.mlp).compile(train=True, optimizer="sgd:lr=0.1")
        x, labels = batches(2, seed=7)
        with plan.trainer() as trainer:
            for skip in (2, 3):
                with self.assertRaisesRegex(ValueError, "ran out after 2 batches"):
                    trainer.fit(zip(x, labels), skip=skip)
            self.assertEqual(trainer.step_count, 0)
            self.assertEqual(len(trainer.fit(zip(x, labels), skip=1)), 1)

    def test_a_failed_checkpoint_save_says_the_step_trained(self):
        plan = strata.load(self.mlp).compile(train=True, optimizer="sgd:lr=0.1")
        ck = self.path("ck_lost")
        trainer = plan.trainer(checkpoint=ck, checkpoint_every=1)
        shutil.rmtree(ck)
        with open(ck, "w") as f:  # the folder is now a file: the save fails
            f.write("not a folder")
        failed = r"^step 1 trained \(loss [^)]+\) but its checkpoint save failed: "
        with self.assertRaisesRegex(strata.Error, failed):
            trainer.step()
        self.assertEqual(trainer.step_count, 1)
        trainer.close(save=False)

    def test_save_refuses_a_folder_of_another_plans_checkpoint(self):
        model = strata.load(self.mlp)
        sgd = model.compile(train=True, optimizer="sgd:lr=0.1")
        adam = model.compile(train=True, optimizer="adam:lr=0.01")
        folder = self.path("ck_save_into")
        with sgd.trainer() as first:
            first.step()
            first.save(folder)
            first.step()
            first.save(folder)  # this plan's checkpoint: replaced
        self.assertEqual(strata.read_checkpoint(folder)["step"], 2)
        with sgd.trainer() as again:
            again.save(folder)
        self.assertEqual(strata.read_checkpoint(folder)["step"], 0)
        with adam.trainer() as other:
            other.step()
            with self.assertRaisesRegex(strata.Error, re.escape(folder) + ".*another plan"):
                other.save(folder)
        self.assertEqual(strata.read_checkpoint(folder)["fingerprint"], sgd.fingerprint)

    def test_ctrl_c_in_a_loop_saves_and_stops(self):
        plan = self.pipeline_plan("interrupt.splan")
        x, labels = batches(3, seed=3)
        ck = self.path("ck_interrupt")

        def interrupted():
            yield x[0], labels[0]
            yield x[1], labels[1]
            raise KeyboardInterrupt

        trainer = plan.trainer(checkpoint=ck)
        with self.assertRaises(KeyboardInterrupt):
            trainer.fit(interrupted())
        self.assertEqual(strata.read_checkpoint(ck)["step"], 2)
        trainer.close()
        self.assertTrue(trainer.closed)

    def test_steps_release_the_gil(self):
        # Python keeps running while another thread's step computes: samples
        # of the main thread's clock fall well inside the step. Were the GIL
        # held, none could (the margins cover the switches around the call).
        model = strata.zoo.mlp(batch=256, input=2048, hidden=[2048, 2048], classes=10)
        trainer = model.compile(train=True).trainer()
        trainer.step()  # weights and arenas in place
        span = []

        def train():
            start = time.perf_counter()
            trainer.step()
            span.extend([start, time.perf_counter()])

        worker = threading.Thread(target=train)
        samples, ticks = [], 0
        worker.start()
        while worker.is_alive():
            ticks += 1
            if ticks % 256 == 0:
                samples.append(time.perf_counter())
        worker.join()
        trainer.close()
        start, end = span
        if end - start < 0.1:
            self.skipTest(f"a step took {end - start:.3f} s, too short to tell")
        inside = [t for t in samples if start + 0.02 < t < end - 0.02]
        self.assertGreater(len(inside), 10, "Python did not run while strata trained")

    # -- errors ----------------------------------------------------------------

    def test_errors_carry_strata_messages_naming_the_file(self):
        missing = self.path("missing.strata")
        with self.assertRaises(strata.Error) as caught:
            strata.load(missing)
        self.assertIn(missing, str(caught.exception))
        self.assertTrue(caught.exception.code)
        bad = self.path("bad.strata")
        with open(bad, "wb") as f:
            f.write(b"not a model at all")
        with self.assertRaises(strata.Error) as caught:
            strata.load(bad)
        self.assertIn(bad, str(caught.exception))
        with self.assertRaises(strata.InvalidArgumentError) as caught:
            strata.load(self.mlp).run({"x": np.zeros((8, 13), np.float32)})
        self.assertIsInstance(caught.exception, ValueError)
        self.assertIn("input 'x'", str(caught.exception))
        with self.assertRaises(strata.Error) as caught:
            strata.load(self.mlp).compile(train=True, mesh="1x1x2", microbatches=3)
        self.assertIn(self.mlp, str(caught.exception))
        with self.assertRaises(TypeError):
            strata.load(self.mlp).compile(train=True, microbatch=2)

    def test_trainer_errors_name_keywords_not_flags(self):
        plan = strata.load(self.mlp).compile(train=True, optimizer="sgd:lr=0.1")
        ck = self.path("ck_taken")
        with plan.trainer(checkpoint=ck) as first:
            first.step()
        with self.assertRaises(strata.Error) as caught:
            plan.trainer(checkpoint=ck)
        message = str(caught.exception)
        self.assertIn("resume=", message)
        self.assertIn(ck, message)
        self.assertNotIn("--resume", message)
        self.assertNotIn("--checkpoint", message)
        with self.assertRaisesRegex(strata.InvalidArgumentError, "^timeout="):
            plan.trainer(timeout=0)

    def test_keywords_of_the_wrong_type_are_type_errors_naming_them(self):
        for hidden in (["a"], [16, 2.5], "16", 16):
            with self.assertRaisesRegex(TypeError, "hidden must be a list of integers"):
                strata.zoo.mlp(hidden=hidden)
        with self.assertRaisesRegex(TypeError, "mesh must be"):
            strata.load(self.mlp).compile(mesh=(1, "1", 2))
        # Refused before the file is read: a str would be its characters.
        with self.assertRaisesRegex(TypeError, "constants takes a list of names"):
            strata.import_onnx(self.path("missing.onnx"), constants="w")
        with self.assertRaisesRegex(TypeError, "input_shapes"):
            strata.import_onnx(self.path("missing.onnx"), input_shapes={"x": [1, "a"]})

    def test_training_plan_refuses_run_and_inference_plan_a_trainer(self):
        model = strata.load(self.mlp)
        with self.assertRaisesRegex(strata.Error, "trainer"):
            model.compile(train=True).run()
        with self.assertRaisesRegex(strata.Error, "train=True"):
            model.compile().trainer()

    # -- PyTorch ---------------------------------------------------------------

    def test_from_torch_without_torch_says_what_is_missing(self):
        with unittest.mock.patch.dict(sys.modules, {"torch": None}):
            with self.assertRaisesRegex(ImportError, "PyTorch"):
                strata.from_torch(object(), None)

    @unittest.skipIf(torch is None, NO_TORCH)
    def test_from_torch_trains_like_torch_and_loads_back(self):
        if not strata.onnx_import_built:
            self.skipTest("this strata was built without ONNX import")
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(),
                                  torch.nn.Linear(16, 4))
        reference = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(),
                                        torch.nn.Linear(16, 4))
        reference.load_state_dict(net.state_dict())
        x, labels = batches(3, seed=4)
        model = strata.from_torch(net, torch.from_numpy(x[0]))
        plan = model.compile(train=True, optimizer="sgd:lr=0.1", mesh="1x1x2", microbatches=2)
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.from_numpy(x.reshape(-1, 12)),
                                           torch.from_numpy(labels.reshape(-1))),
            batch_size=8, shuffle=False)
        with plan.trainer() as trainer:
            losses = trainer.fit(loader)
            trained = trainer.state_dict(net)
        optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
        expected = []
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(reference(xb), yb)
            loss.backward()
            optimizer.step()
            expected.append(loss.item())
        np.testing.assert_allclose(losses, expected, rtol=1e-4, atol=1e-6)
        net.load_state_dict(trained, strict=True)
        for (name, ours), theirs in zip(net.state_dict().items(), reference.state_dict().values()):
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-5,
                                       err_msg=name)


    @unittest.skipIf(torch is None, NO_TORCH)
    def test_exported_checkpoint_loads_into_torch_and_gives_strata_outputs(self):
        self.need_cli()
        if not strata.onnx_import_built:
            self.skipTest("this strata was built without ONNX import")

        def mlp():
            return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 4))

        torch.manual_seed(3)
        net = mlp()
        x, labels = batches(3, seed=10)
        model = strata.from_torch(net, torch.from_numpy(x[0]))
        plan = model.compile(train=True, optimizer="sgd:lr=0.1", mesh="1x1x2", microbatches=2)
        ck = self.path("ck_export")
        with plan.trainer(checkpoint=ck) as trainer:
            trainer.fit(zip(x[:2], labels[:2]))
            trained = trainer.weights()
        out = self.path("exported.safetensors")
        printed = cli("export", ck, "-o", out)
        self.assertIn("4 parameters", printed)
        metadata, tensors = read_safetensors(out)
        self.assertEqual(metadata, {"format": "pt"})
        self.assertEqual(sorted(tensors), sorted(net.state_dict()))
        for name, value in tensors.items():
            np.testing.assert_array_equal(value, trained[name], err_msg=name)

        fresh = mlp()  # other initial weights, replaced by the exported ones
        fresh.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()},
                              strict=True)
        fresh.eval()
        with torch.no_grad():
            theirs = fresh(torch.from_numpy(x[2])).numpy()
            their_loss = torch.nn.functional.cross_entropy(
                torch.from_numpy(theirs), torch.from_numpy(labels[2])).item()
        # strata's forward with the trained weights: the module holding them,
        # converted; and the loss strata's trainer computes from the checkpoint.
        converted = strata.from_torch(fresh, torch.from_numpy(x[2]))
        ours = converted.run({"x": x[2]})[converted.outputs[0]["name"]]
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
        with plan.trainer(resume=ck) as resumed:
            self.assertEqual(resumed.step_count, 2)
            self.assertAlmostEqual(resumed.step((x[2], labels[2])), their_loss, delta=1e-5)

        # Sharded: the index's files hold the same tensors, each once.
        sharded = self.path("sharded.safetensors")
        cli("export", ck, "-o", sharded, "--max-shard-size", "300")
        with open(sharded + ".index.json") as f:
            index = json.load(f)
        self.assertEqual(index["metadata"]["total_size"],
                         sum(v.nbytes for v in tensors.values()))
        self.assertEqual(sorted(index["weight_map"]), sorted(tensors))
        joined = {}
        for file in sorted(set(index["weight_map"].values())):
            self.assertRegex(file, r"^sharded-0000\d-of-0000\d\.safetensors$")
            for name, value in read_safetensors(os.path.join(self.dir, file))[1].items():
                self.assertNotIn(name, joined)
                self.assertEqual(index["weight_map"][name], file)
                joined[name] = value
        self.assertEqual(sorted(joined), sorted(tensors))
        for name, value in joined.items():
            np.testing.assert_array_equal(value, tensors[name], err_msg=name)

    @unittest.skipIf(torch is None, NO_TORCH)
    def test_dataloader_run_resumes_from_a_checkpoint_exactly(self):
        plan = self.pipeline_plan("loader_resume.splan")
        x, labels = batches(4, seed=5)
        data = torch.utils.data.TensorDataset(torch.from_numpy(x.reshape(-1, 12)),
                                              torch.from_numpy(labels.reshape(-1)))

        def loader():  # shuffled, the same order each time it is built
            return torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, drop_last=True,
                                               generator=torch.Generator().manual_seed(9))

        with plan.trainer() as straight:
            expected = straight.fit(loader())
            final = straight.weights()
        ck = self.path("ck_loader")
        with plan.trainer(checkpoint=ck) as first:
            self.assertEqual(first.fit(loader(), steps=3), expected[:3])
        with plan.trainer(checkpoint=ck, resume=ck) as second:
            rest = second.fit(loader(), skip=second.step_count % len(loader()))
            self.assertEqual(rest, expected[3:])
            for name, value in second.weights().items():
                np.testing.assert_array_equal(value, final[name], err_msg=name)
        with self.assertRaisesRegex(ValueError, "skip"):
            plan.trainer().fit(loader(), skip=-1)

    @unittest.skipIf(torch is None, NO_TORCH)
    def test_bfloat16_tensors_are_converted(self):
        model = strata.load(self.mlp)
        name = model.outputs[0]["name"]
        x = torch.randn(8, 12).to(torch.bfloat16)
        ours = model.run({"x": x})[name]
        np.testing.assert_array_equal(ours, model.run({"x": x.float().numpy()})[name])

    def assert_outputs_match_torch(self, module, example):
        model = strata.from_torch(module, example)
        ours = model.run({"x": example.numpy()})[model.outputs[0]["name"]]
        with torch.no_grad():
            theirs = module(example).numpy()
        self.assertEqual(ours.shape, theirs.shape)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)

    @unittest.skipIf(torch is None, NO_TORCH)
    def test_from_torch_transformer_gives_torchs_outputs(self):
        if not strata.onnx_import_built:
            self.skipTest("this strata was built without ONNX import")
        torch.manual_seed(1)

        class Tiny(torch.nn.Module):
            def __init__(self, vocab=50, d=32, seq=16):
                super().__init__()
                self.emb = torch.nn.Embedding(vocab, d)
                self.pos = torch.nn.Parameter(0.1 * torch.randn(1, seq, d))
                layer = torch.nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
                self.enc = torch.nn.TransformerEncoder(layer, 2)
                self.head = torch.nn.Linear(d, vocab)

            def forward(self, tokens):
                return self.head(self.enc(self.emb(tokens) + self.pos))

        self.assert_outputs_match_torch(Tiny().eval(), torch.randint(0, 50, (2, 16)))

    @unittest.skipIf(torch is None, NO_TORCH)
    def test_from_torch_resnet_gives_torchs_outputs(self):
        if not strata.onnx_import_built:
            self.skipTest("this strata was built without ONNX import")
        try:
            import torchvision
        except ImportError:
            self.skipTest("no torchvision for " + sys.executable + " (apt install python3-torchvision)")
        torch.manual_seed(2)
        net = torchvision.models.resnet18(num_classes=10)
        with torch.no_grad():  # running statistics that are not the identity
            for layer in net.modules():
                if isinstance(layer, torch.nn.BatchNorm2d):
                    layer.running_mean.uniform_(-0.2, 0.2)
                    layer.running_var.uniform_(0.5, 1.5)
        self.assert_outputs_match_torch(net.eval(), torch.randn(2, 3, 32, 32))


if __name__ == "__main__":
    unittest.main(verbosity=2)
