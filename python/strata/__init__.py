"""strata from Python: models, plans and training runs of the strata engine.

The same libraries as the ``strata`` command line, with NumPy arrays and
PyTorch modules at the edges::

    import strata

    model = strata.load("mlp.strata")        # or strata.zoo.mlp(...),
                                             # strata.import_onnx(...),
                                             # strata.from_torch(module, example)
    plan = model.compile(train=True, optimizer="sgd:lr=0.1",
                         mesh="1x1x2", microbatches=4)   # as `strata compile`
    report = plan.inspect()                  # stages, memory, predicted times,
                                             # every transfer and why
    plan.save("pp.splan")

    with plan.trainer(checkpoint="ckpt") as trainer:    # saved at the end,
        losses = trainer.fit(loader)                     # and at Ctrl-C
    module.load_state_dict(trainer.state_dict(module))

Errors are strata.Error subclasses carrying strata's message, which names
the file, node, tensor, option or rank at fault. Calls that compute release
the GIL. Ctrl-C during a step takes effect when the step is done.
"""

import itertools as _itertools

from . import _strata
from ._strata import (
    Error,
    Model,
    Plan,
    Trainer,
    __version__,
    import_onnx,
    load,
    load_model,
    load_plan,
    onnx_import_built,
    read_checkpoint,
    zoo,
)
from ._torch import batches, from_torch, state_dict as _state_dict

# strata.InvalidArgumentError, strata.NotFoundError, ...: one per status code.
_errors = [name for name in dir(_strata) if name.endswith("Error") and name != "Error"]
globals().update({name: getattr(_strata, name) for name in _errors})

__all__ = [
    "Error",
    "Model",
    "Plan",
    "Trainer",
    "__version__",
    "batches",
    "from_torch",
    "import_onnx",
    "load",
    "load_model",
    "load_plan",
    "onnx_import_built",
    "read_checkpoint",
    "zoo",
] + _errors


def _save_if_behind(trainer):
    """Saves into the trainer's checkpoint folder the steps not saved yet."""
    if trainer.checkpoint and trainer.saved_step != trainer.step_count:
        trainer.save()


def _fit(self, batches=None, *, steps=None, skip=0, log_every=0, log=print):
    """Trains one step per batch and returns the losses.

    batches: an iterable of batches as step() takes them (a PyTorch
    DataLoader yielding (x, labels), dicts by input name, ...); None trains
    on the trainer's own batches (its data folder, or synthetic ones), which
    then needs steps. steps: at most this many steps in this call; no batch
    past those is taken from the iterable, so calls on one iterator go on
    where the last one stopped.
    skip: batches to pass over first, untrained: to finish the epoch that a
    resumed run was in, skip=trainer.step_count % len(loader) over the
    loader built as before (same seed). An iterable that runs out before
    anything is left to train is a ValueError.
    log_every: call log("step N  loss L") every that many steps (0: never).

    With a checkpoint folder, the steps are saved there at the end, and when
    Ctrl-C (KeyboardInterrupt) stops the loop, after the step in flight;
    the interrupt is then raised again. An error of strata saves nothing.
    """
    if batches is None and steps is None:
        raise ValueError("fit() needs batches, or steps= to train on the trainer's own batches")
    if steps is not None and steps < 0:
        raise ValueError(f"fit(): steps must be at least 0, got {steps}")
    if skip < 0:
        raise ValueError(f"fit(): skip must be at least 0, got {skip}")
    if skip and batches is None:
        raise ValueError("fit(): skip needs batches (the trainer's own batches follow its step)")
    if batches is None:
        source = _itertools.repeat(None)
    else:
        source = iter(batches)
        passed = sum(1 for _ in _itertools.islice(source, skip))
    if steps is not None:
        source = _itertools.islice(source, steps)
    losses = []
    try:
        for batch in source:
            loss = self.step(batch)
            losses.append(loss)
            if log_every and len(losses) % log_every == 0:
                log(f"step {self.step_count}  loss {loss:.4f}")
    except KeyboardInterrupt:
        _save_if_behind(self)
        raise
    if skip and not losses and steps != 0:
        raise ValueError(
            f"fit(): skip={skip}, but the iterable ran out after {passed} "
            f"batch{'' if passed == 1 else 'es'}: nothing was left to train (to finish "
            f"an epoch after resume=, skip=trainer.step_count % len(loader))")
    _save_if_behind(self)
    return losses


Trainer.fit = _fit
Trainer.state_dict = _state_dict
