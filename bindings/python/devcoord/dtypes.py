"""Tensor element types: the library's numbers, their sizes, and how Python holds them.

Names are the library's ("f32", "f64", "i32", "i64"; "f16" and "bf16" as the C library adds
them). ``typecode`` is the array.array type code of an element: f16 and bf16 have none, so
their elements come back as raw 16-bit patterns ("H"); numpy holds f16 as float16 and bf16
as uint16 patterns.
"""

import array
import sys
from dataclasses import dataclass

from .errors import error_for


@dataclass(frozen=True)
class DType:
    """One element type: its name, dc_dtype number, bytes per element, array.array type code
    and numpy dtype name."""

    name: str
    number: int
    size: int
    typecode: str
    numpy: str


def _typecode(size, candidates):
    for c in candidates:
        if array.array(c).itemsize == size:
            return c
    raise ImportError("devcoord: no array.array type code of %d bytes" % size)


DTYPES = {d.name: d for d in (
    DType("f32", 1, 4, "f", "float32"),
    DType("f64", 2, 8, "d", "float64"),
    DType("i32", 3, 4, _typecode(4, "ilh"), "int32"),
    DType("i64", 4, 8, _typecode(8, "lq"), "int64"),
    DType("f16", 5, 2, "H", "float16"),
    DType("bf16", 6, 2, "H", "uint16"),
)}
BY_NUMBER = {d.number: d for d in DTYPES.values()}

# numpy dtype names and buffer-protocol formats understood on put.
_FROM_NUMPY = {d.numpy: d for d in DTYPES.values() if d.name != "bf16"}
_FORMAT_KINDS = {"f": "f", "d": "f", "e": "f", "b": "i", "h": "i", "i": "i", "l": "i", "q": "i"}


def dtype(value):
    """The DType for a name ("f32"), a DType, or a numpy dtype; raises
    devcoord.InvalidArgument (a ValueError)."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    meta = getattr(value, "metadata", None)  # a numpy dtype of alloc(..., "bf16")
    if meta and meta.get("devcoord") in DTYPES:
        return DTYPES[meta["devcoord"]]
    name = getattr(value, "name", None)
    if name in _FROM_NUMPY:
        if getattr(value, "isnative", True) is False:
            # ">f4" is named "float32" too: its bytes would be read in the wrong order.
            raise error_for(3, "dtype %r is not in this machine's byte order (%s-endian); "
                               "convert it first (e.g. arr.astype(arr.dtype.newbyteorder('=')))"
                            % (value, sys.byteorder))
        return _FROM_NUMPY[name]
    raise error_for(3, "unknown dtype %r (expected one of %s)"
                     % (value, ", ".join(DTYPES)))


# Format prefixes that name the other byte order than this machine's.
_FOREIGN_ORDER = ">!" if sys.byteorder == "little" else "<"


def from_format(fmt, itemsize):
    """The DType of a buffer-protocol format ("f", "<d", "q", ...) and item size, or None;
    raises devcoord.InvalidArgument for a format in the other byte order than this
    machine's, whose bytes the library would read wrong."""
    if fmt[:1] and fmt[0] in _FOREIGN_ORDER:
        raise error_for(3, "the buffer's format %r is not in this machine's byte order "
                           "(%s-endian); convert it first" % (fmt, sys.byteorder))
    kind = _FORMAT_KINDS.get(fmt.lstrip("@=<>!"))
    if kind is None:
        return None
    for d in DTYPES.values():
        if d.size == itemsize and (d.typecode in "fd" or d.name == "f16") == (kind == "f") \
                and d.name != "bf16":
            return d
    return None
