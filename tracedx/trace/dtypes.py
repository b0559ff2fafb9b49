"""Bytes per element of the dtype names torch.profiler writes into a trace.

Two spellings reach a trace. ``Input type`` (record_shapes) holds each input's C++ type name
(``float``, ``c10::BFloat16``, ``long int``): :data:`INPUT_TYPE_BYTES`, where a name denotes a
tensor, and whose sizes are the element sizes of PyTorch's ``c10/core/ScalarType.h``.
``record_param_comms`` writes a collective's ``dtype`` as ``c10::toString(ScalarType)``
(``Float``, ``BFloat16``): :data:`SCALAR_TYPE_BYTES`. :data:`DTYPE_BYTES` reads either,
plus the lower-case names some ``record_function`` labels use (``half``, ``bfloat16``).
"""

from __future__ import annotations

INPUT_TYPE_BYTES: dict[str, int] = {
    "double": 8,
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1,
    "long int": 8,
    "long": 8,
    "long long": 8,
    "int": 4,
    "short int": 2,
    "short": 2,
    "signed char": 1,
    "unsigned char": 1,
    "unsigned short": 2,
    "unsigned int": 4,
    "unsigned long": 8,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4,
    "c10::qint8": 1,
    "c10::quint8": 1,
    "c10::qint32": 4,
}
"""Bytes per element of each ``Input type`` string that denotes a tensor."""

SCALAR_TYPE_BYTES: dict[str, int] = {
    "Double": 8,
    "Float": 4,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
    "ComplexHalf": 4,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
    "Float8_e8m0fnu": 1,
}
"""Bytes per element of each ``c10::toString(ScalarType)`` name."""

DTYPE_BYTES: dict[str, int] = {
    **SCALAR_TYPE_BYTES,
    **INPUT_TYPE_BYTES,
    "half": 2,
    "bfloat16": 2,
    "char": 1,
}
"""Bytes per element of a dtype in either spelling (a collective's ``dtype``)."""
