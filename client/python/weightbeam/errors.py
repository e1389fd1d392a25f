"""Errors of the weightbeam Python client: every failure is a WeightbeamError whose text is the
agent's or controller's message, unchanged, and whose ``code`` is the status code name."""

# absl / google.rpc status codes by number (SessionResponse.code carries these).
_CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class WeightbeamError(Exception):
    """A failed call. ``str(error)`` is the server's message; ``code`` e.g. "INVALID_ARGUMENT"."""

    def __init__(self, message, code="UNKNOWN"):
        super().__init__(message)
        self.message = message
        self.code = _CODE_NAMES.get(code, str(code)) if isinstance(code, int) else code


class StepFailed(WeightbeamError):
    """A step the controller ran but could not commit; ``result`` is its StepResult (per-agent
    reports included) and the message names the agent and cause."""

    def __init__(self, message, result=None, code="ABORTED"):
        super().__init__(message, code)
        self.result = result


class StepTimeout(WeightbeamError, TimeoutError):
    """A wait on a StepHandle that ran out before the step got there (the step goes on)."""

    def __init__(self, message):
        super().__init__(message, "DEADLINE_EXCEEDED")


def from_rpc_error(error, what):
    """A WeightbeamError from a grpc.RpcError; ``what`` says where (used when no detail came)."""
    code = error.code().name if hasattr(error, "code") and error.code() else "UNKNOWN"
    detail = error.details() if hasattr(error, "details") else None
    return WeightbeamError(detail or f"{what}: {code}", code)
