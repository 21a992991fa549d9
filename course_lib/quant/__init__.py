"""Weight quantisation (Lab 4): schemes and storage accounting, int4 packing, GGUF blocks.

Modules: ``formats`` (QuantScheme, quantize/dequantize/fake_quantize, storage_bytes, FORMATS),
``packing`` (pack_int4/unpack_int4, PackedInt4), ``ggml_blocks`` (GGUF Q4_0/Q4_1/Q8_0 blocks,
byte-identical to the gguf package, and a GGUF tensor reader), ``perplexity`` (token windows,
perplexity), ``layers`` (a decoder's linear layers, temporary weight swaps), ``outliers``
(activation maxima through forward pre-hooks), ``smoothquant`` (W8A8 and SmoothQuant), ``awq``
(activation-aware weight scaling for one layer), ``gptq`` (Hessians and GPTQ), ``floats`` (fp32,
bf16, fp16 and fp8 layouts: largest finite value, machine epsilon). ``kv_cache`` (the simulated
int8 KV cache) wraps the decoder's attention and ``int4_cpu`` (the GGUF file's Q4_1 codes as packed int4
through PyTorch's CPU int4 matmul, and the int4 decoder) builds decoders, so both sit above
``course_lib.models`` and are imported as ``course_lib.quant.kv_cache`` / ``course_lib.quant.int4_cpu``,
not from here (docs/architecture.md#layers).
"""
from .formats import (FORMATS, GRANULARITIES, SCALE_BYTES, SCALE_TORCH_DTYPES, QuantizedTensor, QuantScheme,
                      StorageBytes, StorageFormat, bits_per_weight, dequantize, fake_quantize, qmax, quantize,
                      storage_bytes)
from .packing import NIBBLE_ORDERS, PackedInt4, pack_int4, pack_weight, unpack_int4
from .ggml_blocks import (GGML_BLOCK, GGML_BLOCK_BYTES, dequantize_ggml, quantize_q4_0, quantize_q4_1,
                          quantize_q8_0, read_gguf_tensor)
from .perplexity import perplexity, token_windows, window_nll
from .layers import linear_layers, quantized, select_linear_layers
from .outliers import input_absmax, observe_linear_inputs, outlier_table, run_windows
from .smoothquant import (SMOOTHING_FLOOR, W8A8_WEIGHT_SCHEME, fake_quantize_activation, smoothing_scales,
                          w8a8)
from .gptq import GPTQResult, collect_hessians, damp_hessian, gptq_quantize, hessian
from .awq import AWQ_FLOOR, AWQResult, awq_quantize, awq_scales
from .floats import FLOAT_FORMATS, FloatFormat, float_format
