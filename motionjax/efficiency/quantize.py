"""Post-training int8 quantization with qwix.

Why qwix (over aqtp): qwix quantizes an existing Flax NNX model as it is: ``qwix.quantize_model``
intercepts the model's ``dot_general``/``einsum``/``conv`` calls by module-path rules, so
``motionjax.models`` needs no change (aqtp wants its ``dot_general`` injected into every layer by
the model code). It is the maintained successor of AQT from the same group, stores int8 values
with per-channel fp32 scales (``QArray``), and covers both weight-only and weight+activation
(dynamic, per-token scales) int8.

Weights: per-output-channel absmax int8 (every ``nnx.Linear``/``nnx.Conv`` kernel; biases and
LayerNorm scales stay fp32: a few hundred numbers). Activations: int8 with dynamic scales where it
pays: on XLA:CPU an int8 x int8 matmul is not faster than fp32, so the default leaves activations in
fp32 (weight-only), and ``activations=True`` is kept for accelerators with int8 matmul units. One
exception: qwix's PTQ quantizes a convolution's weights only together with its input (it raises
otherwise), so the default gives ``nnx.Conv`` layers (the temporal conv model's) int8 inputs too.
"""
from __future__ import annotations

import numpy as np
from flax import nnx


def quantize(model: nnx.Module, example, activations: bool = False, module_path: str = ".*") -> nnx.Module:
    """An int8 copy of ``model`` (eval mode) for inputs like ``example [B, N, C, F]``.

    ``module_path``: regex of the layers to quantize (qwix's rule; ``.*``: all matmuls/convs).
    """
    import qwix

    rules = [qwix.QuantizationRule(module_path=module_path, weight_qtype="int8",
                                   act_qtype="int8" if activations else None)]
    if not activations:  # qwix quantizes a conv's input along with its int8 weights, or neither
        rules.insert(0, qwix.QuantizationRule(module_path=f"(?=.*conv$){module_path}", weight_qtype="int8",
                                              act_qtype="int8"))
    quantized = qwix.quantize_model(model, qwix.PtqProvider(rules), np.asarray(example, np.float32))
    quantized.eval()
    return quantized
