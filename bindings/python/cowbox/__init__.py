"""cowbox: copy-on-write sandbox workspaces for AI agents, as an asyncio client (stdlib only).
Sandbox satisfies the LiteLLM harness Sandbox protocol."""

from .errors import (AccessDeniedError, ConflictError, InvalidPathError, InvalidRequestError, WorkspaceError,
                     WorkspaceInUseError, WorkspaceNotFoundError, WorkspaceOutputLimitError,
                     WorkspaceTimeoutError, WorkspaceUnavailableError)
from .network import HeaderBinding, Network
from .sandbox import Changes, CompletedRun, FileChange, Process, Sandbox, file_changes

CowboxSandbox = Sandbox

__all__ = [
    "Sandbox", "CowboxSandbox", "Network", "HeaderBinding", "Process", "CompletedRun", "Changes",
    "FileChange", "file_changes",
    "WorkspaceError", "WorkspaceNotFoundError", "InvalidPathError", "WorkspaceInUseError",
    "WorkspaceUnavailableError", "WorkspaceTimeoutError", "WorkspaceOutputLimitError",
    "InvalidRequestError", "AccessDeniedError", "ConflictError",
]
__version__ = "0.1.0"

# Missing files, bases and binary as the standard exceptions' subclasses (issue 33).
from .errors import BaseNotADirectoryError, BaseNotFoundError, CowboxBinaryNotFoundError  # noqa: E402

__all__ += ["BaseNotFoundError", "BaseNotADirectoryError", "CowboxBinaryNotFoundError"]
