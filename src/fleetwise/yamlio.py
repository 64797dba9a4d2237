"""Reading the YAML (and JSON) files users write: scenarios, experiments, topology files.

One loader for all of them: PyYAML's safe loader (no Python objects), and a mapping that names a key twice is
an error (plain YAML loaders keep the last value silently). Every failure is an
:class:`~fleetwise.errors.InputError` whose one line names the file (and the line where known).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from fleetwise.errors import InputError, nonblocking_opener, with_article
from fleetwise.limits import MAX_ALIAS_VALUES, MAX_FILE_BYTES

_MERGE_TAG = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects a mapping naming one key twice (keys brought in by a ``<<`` merge may
    be overridden, as YAML's merge-key spec allows)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, Hashable):
                    if key in seen:
                        raise ConstructorError("while constructing a mapping", node.start_mark,
                                               f"found duplicate key {key!r}", key_node.start_mark)
                    seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def compose_node(self, parent, index):
        if self.check_event(yaml.events.AliasEvent):
            self.aliases = getattr(self, "aliases", 0) + 1
        return super().compose_node(parent, index)


# an integer scalar longer than this is refused as the file is read, as Python refuses a longer decimal one: base-60
# ones took quadratic time (600 KB of "1:1:..." 25 s), and 5,000 hex digits could not be printed in an error
MAX_INT_CHARS = 4300


def _construct_int(loader, node):
    if len(node.value) > MAX_INT_CHARS:
        raise ConstructorError(None, None, f"an integer of {len(node.value):,} characters (at most {MAX_INT_CHARS})",
                               node.start_mark)
    return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)


def _construct_timestamp(loader, node):
    try:
        return yaml.constructor.SafeConstructor.construct_yaml_timestamp(loader, node)
    except ValueError as e:  # (2001-13-45 is a timestamp to the resolver, and no date to datetime)
        raise ConstructorError(None, None, f"{node.value[:40]!r} is not a valid date or time ({e})",
                               node.start_mark) from None


def _no_binary(loader, node):  # (bytes became text in a name check and skipped it)
    raise ConstructorError(None, None, "a !!binary value: not taken in these files", node.start_mark)


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)
UniqueKeyLoader.add_constructor("tag:yaml.org,2002:binary", _no_binary)


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of a file; one-line errors for a folder, a device or a pipe, a file over ``MAX_FILE_BYTES``, an
    unreadable file or bytes that are not UTF-8."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: is a folder, expected {with_article(what)} file")
    try:
        with open(p, "rb", opener=nonblocking_opener) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise InputError(f"{p}: not a regular file (a device, a pipe or a socket), expected "
                                 f"{with_article(what)} file")
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise InputError(f"{p}: cannot read {what} file ({e.strerror or e})") from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"{p}: larger than {MAX_FILE_BYTES // 2**20} MiB, the limit for {with_article(what)} file "
                         "(docs/limits.md)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise InputError(f"{p}: line {line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def _expanded_values(obj: Any, memo: dict[int, int], limit: int) -> int:
    """How many values ``obj`` holds once every alias is copied out (each shared list or mapping counted once
    per reference, computed once); stops counting past ``limit``."""
    if not isinstance(obj, (list, dict)):
        return 1
    n = memo.get(id(obj))
    if n is None:
        n = 1
        for v in (obj.values() if isinstance(obj, dict) else obj):
            n += _expanded_values(v, memo, limit)
            if n > limit:
                break
        memo[id(obj)] = n
    return n


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML text with :class:`UniqueKeyLoader`; ``where`` (a file name) starts the error line. A document
    with aliases that expand to more than ``MAX_ALIAS_VALUES`` values (a "billion laughs") is refused here, before
    anything walks, copies or prints it."""
    try:
        loader = UniqueKeyLoader(text)  # (what yaml.load does, keeping the loader to read its alias count)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
        if getattr(loader, "aliases", 0) and _expanded_values(data, {}, MAX_ALIAS_VALUES) > MAX_ALIAS_VALUES:
            raise InputError(f"{where}: its YAML aliases expand to more than {MAX_ALIAS_VALUES:,} values "
                             "(docs/limits.md)")
        return data
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"{where}:{line} invalid YAML: {problem}") from None
    except RecursionError:
        raise InputError(f"{where}: invalid YAML: nested too deeply") from None
    except ValueError as e:  # (a constructor's own error that PyYAML does not wrap)
        raise InputError(f"{where}: invalid YAML: {str(e)[:200]}") from None


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def finite_float(text: str) -> float:
    """``parse_float`` for ``json.loads``: a number beyond a double (``1e999``, read as infinity) is a ValueError."""
    x = float(text)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is beyond a double")
    return x


def loads_strict(data: str | bytes) -> Any:
    """``json.loads`` that refuses what is not JSON but Python's parser takes: ``NaN``, ``Infinity`` and a
    number beyond a double (``1e999``, read as infinity); ValueError (RecursionError when nested too deep)."""
    return json.loads(data, parse_constant=_no_constant, parse_float=finite_float)


def non_finite(v: Any, max_int: int | None = None) -> bool:
    """Whether ``v`` (nested dicts, lists and tuples, as parsed JSON) holds a NaN or infinite float, or (with
    ``max_int``) an integer larger than that in size; walked without recursion (a list nested 500 deep hit the
    recursion limit)."""
    import math

    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, float):
            if not math.isfinite(x):
                return True
        elif isinstance(x, int):
            if max_int is not None and not isinstance(x, bool) and abs(x) > max_int:
                return True
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return False


def json_safe(v: Any) -> Any:
    """``v`` with every NaN or infinite float, in nested dicts, lists and tuples, as None (null): neither is JSON
    (a quantile of no request is NaN; an interval over one run is undefined)."""
    import math

    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def parse_json(text: str, where: str) -> Any:
    """Parse JSON text; a duplicate key in an object is an error, as for YAML."""
    try:
        return json.loads(text, object_pairs_hook=unique_pairs)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: line {e.lineno}: invalid JSON: {e.msg}") from None
    except (ValueError, RecursionError) as e:
        raise InputError(f"{where}: invalid JSON: {e or 'nested too deeply'}") from None


def load_file(path: str | Path, what: str = "file") -> Any:
    """Read and parse a YAML file (JSON when the name ends in ``.json``)."""
    p = Path(path)
    text = read_text(p, what)
    return parse_json(text, str(p)) if p.suffix.lower() == ".json" else parse_yaml(text, str(p))
