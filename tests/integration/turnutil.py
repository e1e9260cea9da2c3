"""Helpers for the turn tests: the state of a tree as cowbox maps it (files with content and
mode, directories with mode, symlinks with target) and the diff events two states imply."""

import hashlib
import os
import stat


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_state(root):
    """{relative path: ("file", mode, sha256) | ("dir", mode) | ("symlink", target)}."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                state[rel] = ("symlink", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                state[rel] = ("dir", stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode):
                state[rel] = ("file", stat.S_IMODE(st.st_mode), sha256_file(full))
    return state


def files_of(state):
    """The snapshot() view: regular files only, path -> sha256."""
    return {p: v[2] for p, v in state.items() if v[0] == "file"}


def expected_events(a, b):
    """{path: kind} for the changes from state a to state b, as cowbox names them."""
    out = {}
    for path in set(a) | set(b):
        old, new = a.get(path), b.get(path)
        if old == new:
            continue
        if old is None:
            out[path] = "created"
        elif new is None:
            out[path] = "deleted"
        elif old[0] != new[0]:
            out[path] = "type_changed"
        elif old[0] == "symlink":
            out[path] = "modified"
        elif old[0] == "dir" or old[2] == new[2]:
            out[path] = "mode_changed"
        else:
            out[path] = "modified"
    return out


def sha256sum_line(sha, name):
    """One line of coreutils 9 sha256sum output for name."""
    if any(c in name for c in "\\\n\r"):
        esc = name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        return "\\%s  %s\n" % (sha, esc)
    return "%s  %s\n" % (sha, name)
