"""devcoord.Error and one subclass per gRPC-style status code.

Every failing call of the package raises a subclass of Error: the class says the code
(``devcoord.NotFound`` for NOT_FOUND, ...), ``.code`` is the code's name and ``.message`` the
message the server (or the library, for local checks) gave.
"""

# gRPC's canonical codes, numbered as include/devcoord/status.h.
CODES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class Error(Exception):
    """A failed devcoord call.

    Attributes:
        code: the status code's name, e.g. "NOT_FOUND".
        message: the server's (or library's) message.
        transport: True when no answer came from the server (unreachable, TLS failure,
            deadline passed before a reply).
        device_index: index of the offending entry of a device list, or -1.
        worker: the worker the failure is about, or "".
        op: for submit/plan, the op result (devcoord.Op) when the coordinator answered.
    """

    code = "UNKNOWN"

    def __init__(self, message, transport=False, device_index=-1, worker="", op=None):
        super().__init__(message)
        self.message = message
        self.transport = transport
        self.device_index = device_index
        self.worker = worker
        self.op = op

    def __str__(self):
        return "%s: %s" % (self.code, self.message)


def _class_name(code):
    return "".join(part.capitalize() for part in code.split("_"))


# Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
# PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
# Internal, Unavailable, DataLoss, Unauthenticated.
# InvalidArgument is a ValueError too: the package's own argument checks raise it as well.
BY_CODE = {}
for _number, _code in CODES.items():
    if _number == 0:
        continue
    _bases = (Error, ValueError) if _code == "INVALID_ARGUMENT" else (Error,)
    BY_CODE[_number] = type(_class_name(_code), _bases, {
        "code": _code, "__doc__": "devcoord.Error with code %s." % _code})
globals().update({cls.__name__: cls for cls in BY_CODE.values()})

__all__ = ["Error", "CODES"] + [cls.__name__ for cls in BY_CODE.values()]


def error_for(number, message, **kw):
    """The Error subclass instance for status code `number` (UNKNOWN for numbers outside the
    table)."""
    return BY_CODE.get(number, BY_CODE[2])(message, **kw)
