"""One exception type for bad user input: the CLI prints its message as one line and exits with status 2."""


class InputError(ValueError):
    """Bad input (config, trace, request). The message names the file, field or row and what was expected."""


def _fmt_loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))


def short_repr(v, limit: int = 40) -> str:
    """``repr(v)`` for an error line: cut to about ``limit`` characters with the full length named; an integer too
    large to print (Python refuses over 4,300 digits) by its size."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 4 * limit:
        return f"an integer of {int(v.bit_length() * 0.30103) + 1:,} digits"
    try:
        r = repr(v)
    except ValueError:  # (a container holding such an integer)
        return f"a {type(v).__name__} holding an integer too large to print"
    return r if len(r) <= limit else f"{r[:limit // 2]}... ({len(r):,} characters)"


def format_validation_error(e, where: str) -> str:
    """A pydantic ``ValidationError`` as one line: ``where: field.path: what is wrong (got value)``."""
    err = e.errors()[0]
    loc = _fmt_loc(err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    got = err.get("input")
    r = short_repr(got, 60)
    got_s = "" if err["type"] in ("missing", "extra_forbidden", "value_error") or isinstance(got, (dict, list)) \
        else f" (got {r})"
    if not loc and err["type"] == "value_error":  # a check of the whole model: its message names the fields
        return f"{where}: {msg}{more}"
    return f"{where}: {loc or '<top>'}: {msg}{got_s}{more}"


def with_article(what: str) -> str:
    """``what`` with its indefinite article: "an experiment", "a scenario"."""
    return f"{'an' if what[:1].lower() in 'aeiou' else 'a'} {what}"


def not_a_file(path, what: str) -> str:
    """Why ``path``, which is not a regular file, cannot be read as a ``what`` file: a folder is named as one (it was
    "not found"), anything else as not found."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        return f"a folder, not {with_article(what)} file"
    return f"{what} file not found" if not p.exists() else f"not a regular file, expected {with_article(what)} file"


def check_replaceable(path) -> None:
    """``path`` may be written by renaming a temporary file over it: absent, a regular file, or a symbolic link (the
    link is replaced, not what it points to). A device, a pipe or a socket is refused: renaming a file over
    ``/dev/null`` as root would replace the device with that file. Directories are the writers' own message."""
    import os
    import stat

    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as e:
        raise InputError(f"{path}: cannot write ({e.strerror})") from None
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)):
        raise InputError(f"{path}: not a regular file (a device, a pipe or a socket); refusing to replace it")


def nonblocking_opener(path, flags: int) -> int:
    """``open(path, "rb", opener=nonblocking_opener)``: the open itself never waits. Opening a named pipe (FIFO) for
    reading waits for a writer, so a FIFO named as a model card or a scenario hung the reader (and a service's
    reload, and its shutdown) before the ``fstat`` regular-file check could refuse it; with ``O_NONBLOCK`` the open
    returns at once and that check runs. (No effect on reading regular files.)"""
    import os

    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))
