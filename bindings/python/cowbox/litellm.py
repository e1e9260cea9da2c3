"""LiteLLM harness spellings over cowbox.Sandbox: `from cowbox.litellm import sandbox`, then
sandbox.local(path) or sandbox.docker(image, mounts=, workdir="/workspace"), as its docs write.

Each object satisfies LiteLLM's Sandbox protocol (workdir, exec, run, read, write, host_url,
which, snapshot, close) and creates its cowbox workspace on the first await: no I/O at
construction, as `box = sandbox.docker(...)` is synchronous on the page. Everything runs
through one cowbox.Sandbox (box.cowbox once started); nothing here is a second sandbox."""

import asyncio
import os

from .errors import InvalidPathError, WorkspaceNotFoundError, WorkspaceUnavailableError
from .sandbox import Sandbox


class HarnessInstallFailed(WorkspaceNotFoundError):
    """The runtime binary a command names is not installed in the sandbox (for
    sandbox.local: not on your PATH). .binary names it."""

    def __init__(self, binary, where):
        super().__init__("%s is not installed in the sandbox (%s): install it first" %
                         (binary, where), code="not_found")
        self.binary = binary


def _program(cmd):
    """The program a list command names (None for a shell string: sh reports its own)."""
    if isinstance(cmd, str) or not cmd:
        return None
    return str(cmd[0])


class _HarnessSandbox:
    """What sandbox.local and sandbox.docker return: LiteLLM's Sandbox protocol over a
    cowbox.Sandbox made on first use. close() destroys the workspace (a container of
    LiteLLM's goes with its sandbox too); with keep=True it only stops it (box.ref to
    attach later). The folder that holds the files (path, or the mount of /workspace) keeps
    its content either way."""

    def __init__(self, create_args, workdir, keep, cowbox, home):
        self._create_args = create_args
        self.workdir = workdir
        self._keep = keep
        self._cowbox_bin, self._home = cowbox, home
        self.cowbox = None  # the cowbox.Sandbox, once started
        self._starting = None

    @property
    def ref(self):
        return self.cowbox.ref if self.cowbox else None

    async def start(self):
        """Create the workspace now (the first operation does it otherwise); returns the
        cowbox.Sandbox. Concurrent first uses share one creation."""
        if self.cowbox is not None:
            return self.cowbox
        if self._starting is None:
            self._starting = asyncio.ensure_future(Sandbox.create(
                cowbox=self._cowbox_bin, home=self._home, **self._create_args))
        try:
            box = await asyncio.shield(self._starting)
        except BaseException:
            if self._starting.done():
                self._starting = None  # a failed create may be tried again
            raise
        if self.cowbox is None:
            self.cowbox = box
            await box._connect()  # so that host_url() finds the daemon at once
        return self.cowbox

    # --- the protocol ---

    def _cmd(self, cmd, cwd):
        return cmd, cwd

    async def _check_program(self, box, program):
        if program is not None and await box.which(program) is None:
            raise HarnessInstallFailed(program, self._where())

    def _where(self):
        return "image %s" % self._create_args.get("image")

    async def exec(self, cmd, *, env=None, cwd=None, **extra):
        """Start cmd; a list whose program is not installed raises HarnessInstallFailed."""
        box = await self.start()
        await self._check_program(box, _program(cmd))
        cmd, cwd = self._cmd(cmd, cwd)
        return await box.exec(cmd, env=env, cwd=cwd, **extra)

    async def run(self, cmd, *, env=None, cwd=None, timeout=None, **extra):
        """Run cmd to completion (a CompletedRun). Exit 127 from a list command whose
        program is not installed raises HarnessInstallFailed naming it; 127 from a program
        that is there (its own missing child) stays an exit code."""
        box = await self.start()
        program = _program(cmd)
        cmd, cwd = self._cmd(cmd, cwd)
        result = await box.run(cmd, env=env, cwd=cwd, timeout=timeout, **extra)
        if result.exit_code == 127 and program is not None:
            await self._check_program(box, program)
        return result

    def _path(self, path):
        return path

    async def read(self, path):
        return await (await self.start()).read(self._path(path))

    async def write(self, path, data):
        await (await self.start()).write(self._path(path), data)

    def host_url(self, port):
        """A URL that code inside reaches the host's port with. Synchronous: before the
        workspace exists it is created here when no event loop runs in this thread; inside a
        running loop that would block it, so the creation is started in the background and
        WorkspaceUnavailableError says to await it (await box.start())."""
        if self.cowbox is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                async def boot():
                    # the connection would belong to this short-lived loop: let go of it
                    # (the daemon runs on; the next use reconnects)
                    await (await self.start()).detach()
                asyncio.run(boot())
                self._starting = None
            else:
                if self._starting is None:
                    self._starting = asyncio.ensure_future(Sandbox.create(
                        cowbox=self._cowbox_bin, home=self._home, **self._create_args))
                raise WorkspaceUnavailableError(
                    "host_url: the workspace is still being created; await box.start() (or "
                    "any other operation) first, host_url does not block the event loop")
        return self.cowbox.host_url(port)

    async def host_url_async(self, port):
        """host_url, awaiting the workspace's creation and boot."""
        return await (await self.start()).host_url_async(port)

    async def which(self, binary):
        return await (await self.start()).which(binary)

    async def snapshot(self):
        return await (await self.start()).snapshot()

    async def close(self):
        """Stop the workspace and, unless keep=True, destroy it (quiet if gone)."""
        if self.cowbox is None and self._starting is not None:
            try:
                await self.start()
            except Exception:
                return
        box, self.cowbox, self._starting = self.cowbox, None, None
        if box is None:
            return
        await box.close()
        if not self._keep:
            await Sandbox.destroy(box.ref, cowbox=self._cowbox_bin, home=self._home)

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc):
        await self.close()


class _LocalSandbox(_HarnessSandbox):
    """sandbox.local(path): commands run on the host with path itself as their working
    directory; edits land in path (an in-place workspace: journaled, undoable)."""

    def _where(self):
        return "not on PATH"

    def _cmd(self, cmd, cwd):
        # The local backend starts commands in the workspace's mount; a host subprocess of
        # LiteLLM's starts in path. env -C puts them there (writes to path are journaled by
        # the workspace's base watch before the next snapshot, docs/turns.md "In place").
        where = self.workdir if cwd is None else os.path.join(self.workdir, str(cwd))
        if isinstance(cmd, str):
            cmd = ["sh", "-c", cmd]
        return ["env", "-C", where, "--", "PWD=" + where] + [str(c) for c in cmd], None

    async def _check_program(self, box, program):
        if program is None:
            return
        # which() answers from the host's PATH for local; a path is looked up in the folder.
        if "/" in program:
            full = os.path.join(self.workdir, program)
            if os.access(full, os.X_OK) and os.path.isfile(full):
                return
        elif await box.which(program) is not None:
            return
        raise HarnessInstallFailed(program, self._where())

    def _path(self, path):
        path = str(path)
        if os.path.isabs(path):
            rel = os.path.relpath(path, self.workdir)
            if rel == ".." or rel.startswith("../"):
                raise InvalidPathError("%s is outside the sandbox's folder %s" %
                                       (path, self.workdir), code="invalid_path")
            return rel
        return path


class _Constructors:
    """The module's `sandbox`: sandbox.local(path) and sandbox.docker(image, ...)."""

    @staticmethod
    def local(path, *, keep=False, cowbox=None, home=None):
        """A sandbox whose commands run on the host in path (your user's permissions, the
        provider credentials stripped from their environment: ANTHROPIC_*, OPENAI_*,
        LITELLM_*, AZURE_*, AWS_*, GEMINI_*, GOOGLE_API_KEY, CODEX_*, CURSOR_* and the
        other secrets docs/security.md lists). Edits land in path, journaled: snapshot(),
        and box.cowbox.diff()/rollback() once started."""
        path = os.path.realpath(os.fspath(path))
        if not os.path.isdir(path):
            raise FileNotFoundError("sandbox.local: %s is not a directory" % path)
        return _LocalSandbox({"base": path, "in_place": True, "backend": "local"}, path,
                             keep, cowbox, home)

    @staticmethod
    def docker(image, mounts=None, workdir="/workspace", *, keep=False, cowbox=None,
               home=None):
        """A sandbox in a container of image on the docker engine ($DOCKER_HOST). mounts
        maps host folders (relative ones against the current directory) to paths inside:
        the one at /workspace is the workspace itself, in place (edits land in the folder,
        journaled); the others are bound read-write. workdir is /workspace or a folder
        under it."""
        mounts = dict(mounts or {})
        workdir = os.path.normpath(str(workdir))
        if workdir != "/workspace" and not workdir.startswith("/workspace/"):
            raise ValueError("sandbox.docker: workdir %r: cowbox shows the workspace at "
                             "/workspace; workdir must be it or a folder under it" % workdir)
        args = {"backend": "docker", "image": image, "volumes": []}
        for host, guest in mounts.items():
            host = os.path.realpath(os.path.expanduser(str(host)))
            if os.path.normpath(str(guest)) == "/workspace":
                args.update(base=host, in_place=True)
            else:
                args["volumes"].append((host, str(guest), "rw"))
        if workdir != "/workspace":
            args["working_dir"] = workdir
        if not args["volumes"]:
            del args["volumes"]
        return _HarnessSandbox(args, workdir, keep, cowbox, home)


sandbox = _Constructors()

__all__ = ["sandbox", "HarnessInstallFailed"]
