"""PyTorch at strata's edges: a module in (through torch.onnx), trained
weights out (a state_dict), and a DataLoader's batches as NumPy arrays.

PyTorch is imported only when one of these is called; without it they raise
ImportError saying what is missing.
"""

import collections
import os
import tempfile
import warnings

from . import _strata


def _import_torch(what):
    try:
        import torch
    except ImportError as error:
        raise ImportError(
            f"strata.{what} needs PyTorch, and `import torch` failed ({error}); install it "
            "(Debian: apt install python3-torch, else pip install torch)") from error
    return torch


def from_torch(module, example_inputs, *, input_names=None, output_names=None, opset=13,
               constants=(), path=None):
    """A strata Model of a PyTorch module, exported through torch.onnx.

    example_inputs: a tensor or a tuple of tensors, whose shapes (batch
    included) become the model's: strata's shapes are static. The model's
    weights are the module's current values, under the names of its
    state_dict ('0.weight', 'fc1.bias', ...), so a trainer's state_dict(module)
    loads back into it. input_names default to 'x' (one input) or 'input0',
    'input1', ...; the first output is 'output'. constants: floating
    initializers to keep as constants rather than weights. path: where to
    write the ONNX file (kept); default: a temporary file.

    The export keeps the weights as they are (no constant folding) and
    records the module in evaluation mode, as torch.onnx does by default;
    strata's training plan puts batch normalization back in training form.
    """
    torch = _import_torch("from_torch")
    if not hasattr(torch, "onnx"):
        raise ImportError("strata.from_torch exports through torch.onnx, which this PyTorch "
                          f"({torch.__version__}) lacks")
    if not _strata.onnx_import_built:
        raise ImportError("strata.from_torch imports the module's ONNX export, and this strata was "
                          "built without ONNX import (install libonnx-dev and libprotobuf-dev, "
                          "scripts/setup, and rebuild)")
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (
        example_inputs,)
    if input_names is None:
        input_names = ["x"] if len(inputs) == 1 else [f"input{i}" for i in range(len(inputs))]
    if output_names is None:
        output_names = ["output"]

    def export(onnx_path):
        # Not under torch.no_grad(): with gradients off, PyTorch's transformer
        # layers take a fused path (aten::_transformer_encoder_layer_fwd) that
        # has no ONNX form. The export records no gradients either way.
        # The tracer's warnings (Python values it records as constants) say
        # what strata's static shapes mean anyway.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(module, inputs, onnx_path, input_names=list(input_names),
                              output_names=list(output_names), opset_version=opset,
                              do_constant_folding=False, export_params=True)
        return _strata.import_onnx(onnx_path, constants=list(constants))

    if path is not None:
        return export(os.fspath(path))
    with tempfile.TemporaryDirectory(prefix="strata-from-torch-") as folder:
        return export(os.path.join(folder, "model.onnx"))


def state_dict(trainer, module=None):
    """The trained parameters as a state_dict of torch tensors.

    Without a module: every parameter under its strata name. With one: the
    module's own keys, in its order, each from the parameter of that name
    (as from_torch names them), so that module.load_state_dict(..., strict=True)
    takes it. A key the plan has no parameter of (a buffer such as batch
    norm's running mean) keeps the module's value, with a warning naming it.
    """
    torch = _import_torch("Trainer.state_dict")
    weights = trainer.weights()
    if module is None:
        return collections.OrderedDict(
            (name, torch.from_numpy(array)) for name, array in weights.items())
    result = collections.OrderedDict()
    kept = []
    for key, current in module.state_dict().items():
        if key not in weights:
            result[key] = current.detach().clone()
            kept.append(key)
            continue
        value = torch.from_numpy(weights[key])
        if tuple(value.shape) != tuple(current.shape):
            if value.numel() != current.numel():
                raise ValueError(f"state_dict: strata's '{key}' is {tuple(value.shape)}, the "
                                 f"module's {tuple(current.shape)}")
            value = value.reshape(current.shape)
        result[key] = value.to(dtype=current.dtype, device=current.device)
    if kept:
        warnings.warn("state_dict: the plan has no parameter " + ", ".join(kept) +
                      "; the module's own values are kept for them")
    return result


def _to_numpy(value):
    if isinstance(value, dict):
        return {key: _to_numpy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_numpy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_to_numpy(item) for item in value)
    if hasattr(value, "detach") and hasattr(value, "numpy"):
        return value.detach().cpu().numpy()
    return value


def batches(iterable):
    """Yields each batch of `iterable` (a PyTorch DataLoader, ...) with its
    tensors as NumPy arrays (detached, on the CPU; views of their memory
    where they are there already), lists, tuples and dicts kept.

    Trainer.step and fit take PyTorch tensors as they are; this is for code
    that wants NumPy arrays. A DataLoader whose last batch is short needs
    drop_last=True: a plan's shapes are fixed.
    """
    for batch in iterable:
        yield _to_numpy(batch)
