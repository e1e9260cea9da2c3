"""Exceptions of the cowbox client: one per stable error code of the control protocol."""

import errno as _errno

# Each code's errno, as the C client gives it (cb_client_code_errno): the table is
# daemon/errcode.c's, and bindings/python/tests/test_errors.py checks that the two agree.
CODE_ERRNO = {
    "not_found": _errno.ENOENT,
    "invalid_path": _errno.EINVAL,
    "access_denied": _errno.EACCES,
    "in_use": _errno.EBUSY,
    "timeout": _errno.ETIMEDOUT,
    "output_limit": _errno.EFBIG,
    "invalid_request": _errno.EPROTO,
    "conflict": _errno.EEXIST,
    "unavailable": _errno.EAGAIN,
}


class WorkspaceError(Exception):
    """A cowbox operation failed; code is the protocol's error code and errno the errno the C
    client returns for it (EIO for a code this client does not know)."""

    code = "unavailable"

    def __init__(self, message, code=None, result=None):
        super().__init__(message)
        if code:
            self.code = code
        self.message = message
        self.errno = CODE_ERRNO.get(self.code, _errno.EIO)
        self.result = result  # a CompletedRun for timeout / output_limit of a strict run


class WorkspaceNotFoundError(WorkspaceError, FileNotFoundError):
    """not_found: no such workspace, file, running command or binary (a FileNotFoundError,
    so `except FileNotFoundError` catches a missing file of the workspace)."""

    code = "not_found"


class BaseNotFoundError(WorkspaceNotFoundError):
    """create's base directory does not exist (a FileNotFoundError)."""


class BaseNotADirectoryError(WorkspaceError, NotADirectoryError):
    """create's base is not a directory (a NotADirectoryError)."""

    code = "invalid_request"


class CowboxBinaryNotFoundError(WorkspaceNotFoundError):
    """The cowbox binary is not where COWBOX_BIN (or PATH) says: the message says how to
    point at it."""


class InvalidPathError(WorkspaceError, ValueError):
    """invalid_path: the path leaves the workspace root (.., absolute, symlink out)."""

    code = "invalid_path"


class WorkspaceInUseError(WorkspaceError):
    """in_use: another daemon or request holds it."""

    code = "in_use"


class WorkspaceUnavailableError(WorkspaceError):
    """unavailable: the workspace is gone or its daemon cannot serve."""

    code = "unavailable"


class WorkspaceTimeoutError(WorkspaceError, TimeoutError):
    """timeout: the command (or hook) ran out of time; its tree was killed."""

    code = "timeout"


class WorkspaceOutputLimitError(WorkspaceError):
    """output_limit: the output passed the cap; the command was stopped."""

    code = "output_limit"


class InvalidRequestError(WorkspaceError, ValueError):
    """invalid_request: the daemon refused the request as malformed."""

    code = "invalid_request"


class AccessDeniedError(WorkspaceError, PermissionError):
    """access_denied: the op needs a wider access level than the sandbox has (none < files <
    full), or a wider level was asked than the workspace serves."""

    code = "access_denied"


class ConflictError(WorkspaceError):
    """conflict: apply refused, nothing written; .conflicts lists "PATH: why" for each path
    of the folder that changed since the turn the workspace recorded."""

    code = "conflict"
    conflicts = ()


_BY_CODE = {
    cls.code: cls
    for cls in (WorkspaceNotFoundError, InvalidPathError, WorkspaceInUseError,
                WorkspaceUnavailableError, WorkspaceTimeoutError, WorkspaceOutputLimitError,
                InvalidRequestError, AccessDeniedError, ConflictError)
}


def cli_error(cls, command, stderr, **kw):
    """The exception cls for a failed `cowbox COMMAND` whose stderr is stderr: the CLI's own
    "cowbox COMMAND: why" lines as they are (said once, not prefixed again), else stderr
    after that prefix."""
    lines = [line for line in stderr.strip().splitlines()
             if line.startswith("cowbox %s: " % command)]
    message = "\n".join(lines) if lines else "cowbox %s: %s" % (command, stderr.strip())
    return cls(message, **kw)


def error_from_reply(error, result=None):
    """The exception for a protocol error object {"code":..., "message":..., "result":...}."""
    code = error.get("code", "unavailable")
    result = error.get("result", result)
    cls = _BY_CODE.get(code, WorkspaceError)
    exc = cls(error.get("message", code), code=code, result=result)
    if "conflicts" in error:
        exc.conflicts = list(error["conflicts"])
    return exc
