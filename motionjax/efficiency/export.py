"""Inference exports of a model ``[B, N, C, F] -> [B, N, C, F]``: StableHLO and ONNX.

- StableHLO: ``jax.export`` serializes the jitted forward pass with its weights as constants and a
  symbolic batch size; :func:`load_stablehlo` runs it again in any JAX process (no model code).
- ONNX: ``jax2onnx`` converts the same function for a fixed batch size, 1 by default (a window per
  call: the real-time case); onnxruntime runs it, and
  ``onnxruntime.quantization.quantize_dynamic`` makes its int8 variant (int8 weights, activations
  quantized per call), the usual int8 path of an onnxruntime deployment.

``jax2onnx`` and ``onnxruntime`` are the optional ``export`` extra: imported only when used.

What jax2onnx 0.17.1 cannot convert in our models, and the workarounds here:

- a symbolic batch: our ``reshape``s of ``[B, N, C, D]`` fail with "reshape with symbolic dimensions
  requires mapping to input axes", so each file has a fixed batch;
- a batch above 1 through :class:`motionjax.models.AttentionBlock`: its ``jax.vmap`` over chunks of
  ``jax.nn.dot_product_attention`` with a mask is lowered with a mask of leading size ``N`` (chunks)
  where the scores have ``B·N``; onnxruntime then refuses the file (``ShapeInferenceError`` on the
  ``dpa_weights_masked`` Mul). At batch 1 the two coincide, so a batch ``> 1`` file of a model with
  attention maps the batch-1 graph over its windows (``jax.lax.map``: an ONNX ``Loop``). The conv
  model needs no map, and must not get one: inside a ``Loop`` body jax2onnx types the ``jnp.where``
  of its zero padding as float and int32 at once (``TypeInferenceError`` on a ``Where`` node).
"""
from __future__ import annotations

import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from motionjax import models


def forward(model: nnx.Module):
    """``f(x) -> y``: the model as a pure function of its input, weights closed over (constants)."""
    graphdef, state = nnx.split(model)
    return lambda x: nnx.merge(graphdef, state)(x)


def to_stablehlo(model: nnx.Module, window_shape, path=None) -> bytes:
    """Serialized ``jax.export`` of the forward pass for ``[b, *window_shape]`` float32 inputs, ``b``
    symbolic; written to ``path`` when given."""
    (b,) = jax.export.symbolic_shape("b")
    exported = jax.export.export(jax.jit(forward(model)))(
        jax.ShapeDtypeStruct((b, *window_shape), jnp.float32))
    data = exported.serialize()
    if path is not None:
        Path(path).write_bytes(data)
    return bytes(data)


def load_stablehlo(data_or_path):
    """``predict(x numpy) -> numpy`` from :func:`to_stablehlo`'s bytes or file."""
    data = data_or_path
    if isinstance(data, (str, Path)):
        data = Path(data).read_bytes()
    exported = jax.export.deserialize(bytearray(data))
    call = jax.jit(exported.call)
    return lambda x: np.asarray(call(jnp.asarray(x, jnp.float32)))


def has_attention(model: nnx.Module) -> bool:
    return any(isinstance(node, models.AttentionBlock) for _, node in nnx.iter_graph(model))


def to_onnx(model: nnx.Module, window_shape, path=None, batch: int = 1, opset: int = 21):
    """The ONNX ``ModelProto`` of the forward pass for ``[batch, *window_shape]`` float32 inputs;
    written to ``path`` when given. Raises ``ImportError`` without the ``export`` extra."""
    import jax2onnx

    # jax2onnx imports its example plugins (equinox, dm_pix: not our dependencies) and logs a
    # traceback for each one it cannot import: those are not errors of this conversion.
    logging.getLogger("jax2onnx.plugins.plugin_system").setLevel(logging.CRITICAL)
    fn = forward(model)
    if batch > 1 and has_attention(model):  # module docstring: the mask's batching is lowered wrongly
        one = fn
        fn = lambda x: jax.lax.map(lambda w: one(w[None])[0], x)
    proto = jax2onnx.to_onnx(fn, [(batch, *window_shape)], model_name="motionjax_denoiser",
                             opset=opset, input_names=["noisy"], output_names=["denoised"])
    if path is not None:
        Path(path).write_bytes(proto.SerializeToString())
    return proto


def onnx_predict(model_or_path, threads: int = 1):
    """``predict(x numpy) -> numpy`` with an onnxruntime CPU session on ``threads`` threads; a
    batch larger than the file's fixed batch runs in slices of that size."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # unused-initializer notes are not problems
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    source = model_or_path
    if not isinstance(source, (str, Path)):
        source = source.SerializeToString()
    session = ort.InferenceSession(str(source) if isinstance(source, Path) else source, options,
                                   providers=["CPUExecutionProvider"])
    name, fixed = session.get_inputs()[0].name, session.get_inputs()[0].shape[0]
    run = lambda x: session.run(None, {name: np.asarray(x, np.float32)})[0]

    def predict(x):
        if not isinstance(fixed, int) or len(x) == fixed:
            return run(x)
        if len(x) % fixed:
            raise ValueError(f"batch {len(x)} is not a multiple of the ONNX file's batch {fixed}")
        return np.concatenate([run(x[i:i + fixed]) for i in range(0, len(x), fixed)])

    return predict


def quantize_onnx_int8(src, dst) -> Path:
    """onnxruntime's dynamic int8 quantization of the ONNX file ``src`` (weights int8 per channel;
    activations quantized per call) written to ``dst``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process shapes: ours are static
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        logging.getLogger().setLevel(quiet)
    return Path(dst)
