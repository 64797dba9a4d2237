"""Policy checkpoints that cannot run code on load (docs/security.md): arrays in an ``.npz`` and a JSON model card.

A checkpoint is two files side by side:

- ``NAME.npz``: the policy network's weights as plain numeric arrays plus ``__meta__`` (UTF-8 JSON stored as a
  uint8 array): format and version, decision level, algorithm, observation and action spaces, the network's
  hidden layer sizes and activation, and the observation normalisation if any. Read with
  ``allow_pickle=False`` after the checks below, so nothing in the file is ever executed or unpickled.
- ``NAME.card.json``: the model card (``ModelCard``): level, policy kind, the rule it adjusts (if any),
  creation time, training info, validation result (or null).

``load_policy(path)`` checks before reading any array: the file is a regular file of at most ``max_file_bytes``;
the zip's member names are exactly the ones the metadata calls for (no more, no fewer, no duplicates), stored or
deflated, unencrypted, their declared uncompressed sizes at most ``max_uncompressed_bytes`` in all (a zip bomb is
refused before it is inflated); each array's header declares a numeric dtype and the shape the metadata implies
(an array is allocated only after that). Then ``NumpyPolicy.predict`` runs the actor of Stable-Baselines3's
``MlpPolicy`` (PPO) or Q-network (DQN) in numpy: deterministic action = the Box mean clipped to the bounds, the
argmax for Discrete, per-dimension argmax for MultiDiscrete. Serving needs neither torch nor SB3.

Writing one from a trained SB3 model is ``fleetwise.learn.export`` (it needs torch). This module imports only
numpy and the standard library.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import math
import os
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from fleetwise.errors import InputError, check_replaceable, nonblocking_opener
from fleetwise.yamlio import finite_float, json_safe, unique_pairs

FORMAT = "fleetwise-policy"
VERSION = 1
CARD_FORMAT = "fleetwise-model-card"
CARD_VERSION = 1
SUFFIX = ".npz"
CARD_SUFFIX = ".card.json"
LEVELS = ("allocator", "planner", "scaler", "router", "batcher")
ALGORITHMS = ("ppo", "dqn", "cem")  # cem: a linear policy found by the cross-entropy method (learn/router.py)
MAX_FILE_BYTES = 64 << 20  # on disk
MAX_UNCOMPRESSED_BYTES = 256 << 20  # all members, as declared by the zip (checked before inflating)
MAX_META_BYTES = 1 << 20
MAX_MEMBERS = 256  # zip members (a checkpoint has __meta__ and two per layer); with the directory's size, checked
MAX_DIRECTORY_BYTES = 1 << 20  # before zipfile reads the directory (1.15 M members took 10 s and 620 MB to refuse)
MAX_CARD_BYTES = 1 << 20
MAX_LAYERS = 16
MAX_WIDTH = 1 << 16
HOW_TO_EXPORT = ("export one with `fleetwise export-checkpoint SB3_ZIP OUT.npz` (that command unpickles: only "
                 "for files you trust)")

_ACTIVATIONS = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "leaky_relu": lambda x: np.where(x > 0, x, 0.01 * x),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
    "sigmoid": lambda x: 0.5 * (1.0 + np.tanh(0.5 * x)),
    "identity": lambda x: x,
}
ACTIVATIONS = tuple(_ACTIVATIONS)


class CheckpointError(InputError):
    """A checkpoint that is not one, or not a safe one: one line naming the file and what is wrong."""


# --------------------------------------------------------------------------------------------- model card
@dataclass(frozen=True)
class ModelCard:
    """What a checkpoint is and where it came from (issue 17 extends ``training`` and ``validation``)."""

    level: str  # the decision level it decides (control.registry.LEVELS)
    policy: str  # the policy kind, e.g. "torta" or "rl"
    rule: str | None = None  # the hand-written rule it adjusts, if any (a residual policy)
    created_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    training: dict[str, Any] = field(default_factory=dict)  # data, budget, seed, ...
    validation: dict[str, Any] | None = None  # result against the rule on validation data; None: not validated

    def to_json(self) -> dict[str, Any]:
        return {"format": CARD_FORMAT, "version": CARD_VERSION, "level": self.level, "policy": self.policy,
                "rule": self.rule, "created_at": self.created_at, "training": self.training,
                "validation": self.validation}

    @classmethod
    def from_json(cls, d: Any, where: str = "model card") -> "ModelCard":
        if not isinstance(d, dict):
            raise CheckpointError(f"{where}: expected a JSON object")
        keys = {"format", "version", "level", "policy", "rule", "created_at", "training", "validation"}
        extra = sorted(set(d) - keys)
        if extra:
            raise CheckpointError(f"{where}: unknown field {extra[0]!r}")
        if d.get("format") != CARD_FORMAT or d.get("version") != CARD_VERSION:
            raise CheckpointError(f"{where}: expected format {CARD_FORMAT!r} version {CARD_VERSION}, got "
                                  f"{d.get('format')!r} version {d.get('version')!r}")
        checks = (("level", lambda v: v in LEVELS, f"one of {', '.join(LEVELS)}"),
                  ("policy", lambda v: isinstance(v, str) and 0 < len(v) <= 256, "a name"),
                  ("rule", lambda v: v is None or (isinstance(v, str) and 0 < len(v) <= 256), "a name or null"),
                  ("created_at", _is_iso_time, "an ISO 8601 time"),
                  ("training", lambda v: isinstance(v, dict), "an object"),
                  ("validation", lambda v: v is None or isinstance(v, dict), "an object or null"))
        for name, ok, what in checks:
            if name not in d or not ok(d[name]):
                raise CheckpointError(f"{where}: field {name!r} must be {what}, got {d.get(name)!r:.80}")
        return cls(level=d["level"], policy=d["policy"], rule=d["rule"], created_at=d["created_at"],
                   training=d["training"], validation=d["validation"])


def require_gate(card: ModelCard | None, where: str, force: bool = False) -> None:
    """The deployment gate (docs/learning.md): serving refuses a checkpoint whose model card does not say it beat its
    rule on validation data (``validation`` null, or ``passed`` not true), unless ``force``. One line."""
    if force:
        return
    v = None if card is None else card.validation
    if v is None:
        raise CheckpointError(f"{where}: not validated (its model card has no validation result against its rule): "
                              "refused by the deployment gate; serve it anyway with --force")
    if v.get("passed") is True and v.get("constraint_ok") is False:  # (a card saying both was served)
        raise CheckpointError(f"{where}: its model card says it passed the gate and that its constraint did not hold; "
                              "refused by the deployment gate; serve it anyway with --force")
    if v.get("passed") is not True:
        change, ci = v.get("change"), v.get("ci95")
        what = ""
        if isinstance(change, (int, float)) and not isinstance(change, bool):
            what = f" (change vs {card.rule or 'its rule'} on {v.get('metric', 'the primary metric')}: {change:+.1%}"
            if isinstance(ci, list) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci):
                what += f" [{ci[0]:+.1%}, {ci[1]:+.1%}]"
            what += ")"
        if v.get("constraint_ok") is False and isinstance(v.get("constraint"), str):  # the saving held, a bound did not
            what += f"; its constraint did not hold: {v['constraint'][:200]}"
        raise CheckpointError(f"{where}: did not pass its deployment gate{what}; serve it anyway with "
                              "--force")


def _is_iso_time(v: Any) -> bool:
    if not isinstance(v, str) or len(v) > 64:
        return False
    try:
        _dt.datetime.fromisoformat(v)
    except ValueError:
        return False
    return True


def card_path(checkpoint: str | os.PathLike) -> Path:
    """``dir/NAME.npz`` -> ``dir/NAME.card.json``."""
    p = Path(checkpoint)
    stem = p.name[: -len(SUFFIX)] if p.name.endswith(SUFFIX) else p.name
    return p.with_name(stem + CARD_SUFFIX)


def _reject_constant(c: str) -> Any:
    raise ValueError(f"{c} is not allowed")


def _parse_int(s: str) -> int:
    """JSON integers of a card or a checkpoint's metadata: counts, shapes and seeds, never beyond int64 (a 400-digit
    one overflowed float formatting and math.isfinite downstream)."""
    if len(s.lstrip("-")) > 19 or not -2**63 <= int(s) < 2**63:
        raise ValueError(f"integer of {len(s)} digits is out of range (int64)")
    return int(s)


def read_card(path: str | os.PathLike) -> ModelCard:
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointError(f"model card {path!r:.60}: expected a path")
    p = Path(path)
    try:
        with open(p, "rb", opener=nonblocking_opener) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise CheckpointError(f"model card {p}: not a regular file")
            raw = f.read(MAX_CARD_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointError(f"model card {p}: no such file (a checkpoint is NAME.npz with NAME.card.json "
                              "beside it)") from None
    except OSError as e:
        raise CheckpointError(f"model card {p}: cannot read ({e.strerror})") from None
    if len(raw) > MAX_CARD_BYTES:
        raise CheckpointError(f"model card {p}: larger than {MAX_CARD_BYTES} bytes")
    try:
        # (a float beyond a double, 1e999, was read as infinity and printed as -inf% by the gate)
        d = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, parse_int=_parse_int,
                       parse_float=finite_float, object_pairs_hook=unique_pairs)  # (a key twice: the last won)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"model card {p}: not valid UTF-8 JSON ({str(e).splitlines()[0][:200]})") from None
    return ModelCard.from_json(d, f"model card {p}")


# --------------------------------------------------------------------------------------------- the policy
@dataclass(frozen=True)
class ActionSpec:
    kind: str  # "box" | "discrete" | "multi_discrete"
    shape: tuple[int, ...] = ()  # box
    n: int = 0  # discrete
    nvec: tuple[int, ...] = ()  # multi_discrete

    @property
    def outputs(self) -> int:
        """Width of the network's last layer."""
        if self.kind == "box":
            return int(np.prod(self.shape, dtype=np.int64))
        if self.kind == "discrete":
            return self.n
        return int(sum(self.nvec))

    def to_json(self) -> dict[str, Any]:
        if self.kind == "box":
            return {"kind": "box", "shape": list(self.shape)}
        if self.kind == "discrete":
            return {"kind": "discrete", "n": self.n}
        return {"kind": "multi_discrete", "nvec": list(self.nvec)}


class NumpyPolicy:
    """A deterministic policy network in numpy: ``predict(obs) -> (action, None)`` as SB3's ``predict``."""

    def __init__(self, meta: dict[str, Any], arrays: dict[str, np.ndarray], card: ModelCard | None = None,
                 path: Path | None = None):
        self.meta = meta
        self.card = card
        self.path = path
        self.level: str = meta["level"]
        self.algorithm: str = meta["algorithm"]
        self.obs_shape: tuple[int, ...] = tuple(meta["observation"]["shape"])
        self.action = _action_spec(meta["action"])
        self.activation: str = meta["network"]["activation"]
        self._act = _ACTIVATIONS[self.activation]
        nl = len(meta["network"]["hidden"]) + 1
        self.layers = [(arrays[f"layer{i}_w"].astype(np.float64), arrays[f"layer{i}_b"].astype(np.float64))
                       for i in range(nl)]
        self.obs_low, self.obs_high = arrays["obs_low"], arrays["obs_high"]
        self.act_low = arrays.get("act_low")
        self.act_high = arrays.get("act_high")
        norm = meta.get("obs_norm")
        self.norm = None if norm is None else (arrays["obs_mean"].astype(np.float64),
                                               np.sqrt(arrays["obs_var"].astype(np.float64) + norm["epsilon"]),
                                               float(norm["clip"]))

    def forward(self, obs: np.ndarray) -> np.ndarray:
        """The last layer's output (mean, logits or Q-values) for a batch ``(n, *obs_shape)``."""
        x = np.asarray(obs, np.float64).reshape(len(obs), -1)
        if self.norm is not None:
            mean, std, clip = self.norm
            x = np.clip((x - mean.reshape(-1)) / std.reshape(-1), -clip, clip)
        for i, (w, b) in enumerate(self.layers):
            x = x @ w.T + b
            if i < len(self.layers) - 1:
                x = self._act(x)
        return x

    def predict(self, observation: Any, state: Any = None, episode_start: Any = None,
                deterministic: bool = True) -> tuple[np.ndarray, None]:
        """The deterministic action for one observation (``obs_shape``) or a batch (``(n, *obs_shape)``)."""
        try:
            obs = np.asarray(observation, np.float64)
        except (TypeError, ValueError):
            raise InputError(f"policy {self.name}: observation {observation!r:.60} is not numbers") from None
        single = obs.shape == self.obs_shape
        if not single and (obs.ndim != len(self.obs_shape) + 1 or obs.shape[1:] != self.obs_shape or not len(obs)):
            raise InputError(f"policy {self.name}: observation of shape {obs.shape}, expected {self.obs_shape} or a "
                             f"non-empty batch of them")
        if not np.isfinite(obs).all():  # (NaN in, NaN actions out)
            raise InputError(f"policy {self.name}: an observation with NaN or infinity")
        batch = obs.reshape(1, *self.obs_shape) if single else obs
        out = self.forward(batch)
        a = self.action
        if a.kind == "box":
            act = np.clip(out.reshape(-1, *a.shape), self.act_low, self.act_high).astype(np.float32)
        elif a.kind == "discrete":
            act = out.argmax(axis=1).astype(np.int64)
        else:
            cuts = np.cumsum(a.nvec)[:-1]
            act = np.stack([part.argmax(axis=1) for part in np.split(out, cuts, axis=1)], axis=1).astype(np.int64)
        return (act[0] if single else act), None

    @property
    def name(self) -> str:
        return self.path.name if self.path is not None else f"{self.level}/{self.algorithm}"

    def __repr__(self) -> str:
        return f"NumpyPolicy({self.name!r}, level={self.level!r}, action={self.action.to_json()})"


def _action_spec(d: dict[str, Any]) -> ActionSpec:
    if d["kind"] == "box":
        return ActionSpec("box", shape=tuple(d["shape"]))
    if d["kind"] == "discrete":
        return ActionSpec("discrete", n=int(d["n"]))
    return ActionSpec("multi_discrete", nvec=tuple(d["nvec"]))


# --------------------------------------------------------------------------------------------- metadata
def _pos_int(v: Any, hi: int = MAX_WIDTH) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= hi


def _shape(v: Any) -> bool:
    return isinstance(v, list) and 1 <= len(v) <= 4 and all(_pos_int(x) for x in v) \
        and int(np.prod(v, dtype=np.int64)) <= MAX_WIDTH


def expected_arrays(meta: dict[str, Any], where: str) -> dict[str, tuple[int, ...]]:
    """Check the metadata's schema; the arrays (name -> shape) a checkpoint with this metadata holds."""
    def bad(msg: str) -> CheckpointError:
        return CheckpointError(f"{where}: metadata {msg}")

    if not isinstance(meta, dict):
        raise bad("is not a JSON object")
    if meta.get("format") != FORMAT:
        raise bad(f"format is {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise bad(f"version {meta.get('version')!r} is not supported (this fleetwise reads version {VERSION})")
    allowed = {"format", "version", "level", "algorithm", "observation", "action", "network", "obs_norm"}
    if set(meta) - allowed:
        raise bad(f"has unknown field {sorted(set(meta) - allowed)[0]!r}")
    if meta.get("level") not in LEVELS:
        raise bad(f"level {meta.get('level')!r} is not one of {', '.join(LEVELS)}")
    if meta.get("algorithm") not in ALGORITHMS:
        raise bad(f"algorithm {meta.get('algorithm')!r} is not one of {', '.join(ALGORITHMS)}")
    ob = meta.get("observation")
    if not (isinstance(ob, dict) and set(ob) == {"shape"} and _shape(ob["shape"])):
        raise bad("observation must be {\"shape\": [positive ints]}")
    act = meta.get("action")
    if not isinstance(act, dict):
        raise bad("action must be an object")
    kind = act.get("kind")
    if kind == "box":
        ok = set(act) == {"kind", "shape"} and _shape(act["shape"])
    elif kind == "discrete":
        ok = set(act) == {"kind", "n"} and _pos_int(act["n"])
    elif kind == "multi_discrete":
        ok = (set(act) == {"kind", "nvec"} and isinstance(act["nvec"], list) and 1 <= len(act["nvec"]) <= MAX_WIDTH
              and all(_pos_int(x) for x in act["nvec"]) and sum(act["nvec"]) <= MAX_WIDTH)
    else:
        ok = False
    if not ok:
        raise bad(f"action {json.dumps(act)[:120]} is not a box (shape), discrete (n) or multi_discrete (nvec) space")
    if meta["algorithm"] == "dqn" and kind != "discrete":
        raise bad("a dqn policy needs a discrete action space")
    net = meta.get("network")
    if not (isinstance(net, dict) and set(net) == {"hidden", "activation"} and isinstance(net["hidden"], list)
            and len(net["hidden"]) <= MAX_LAYERS and all(_pos_int(h) for h in net["hidden"])
            and net["activation"] in _ACTIVATIONS):
        raise bad(f"network must be {{\"hidden\": [sizes], \"activation\": one of {', '.join(ACTIVATIONS)}}}")
    norm = meta.get("obs_norm")
    if norm is not None and not (isinstance(norm, dict) and set(norm) == {"clip", "epsilon"}
                                 and all(isinstance(norm[k], (int, float)) and not isinstance(norm[k], bool)
                                         and math.isfinite(norm[k]) and norm[k] > 0 for k in norm)):
        raise bad("obs_norm must be null or {\"clip\": > 0, \"epsilon\": > 0}")
    obs_shape = tuple(ob["shape"])
    d_in = int(np.prod(obs_shape))
    sizes = [d_in, *net["hidden"], _action_spec(act).outputs]
    out: dict[str, tuple[int, ...]] = {"obs_low": obs_shape, "obs_high": obs_shape}
    for i in range(len(sizes) - 1):
        out[f"layer{i}_w"] = (sizes[i + 1], sizes[i])
        out[f"layer{i}_b"] = (sizes[i + 1],)
    if kind == "box":
        out["act_low"] = out["act_high"] = tuple(act["shape"])
    if norm is not None:
        out["obs_mean"] = out["obs_var"] = obs_shape
    return out


# --------------------------------------------------------------------------------------------- loading
def _read_header(fp: Any, where: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = npy_format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(fp, max_header_size=10_000)
        elif version == (2, 0):
            shape, fortran, dtype = npy_format.read_array_header_2_0(fp, max_header_size=10_000)
        else:
            raise ValueError(f"npy version {version}")
    except (ValueError, OSError, EOFError, SyntaxError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"{where}: not a numpy array ({str(e).splitlines()[0][:200]})") from None
    return tuple(shape), dtype


def _numeric(dtype: np.dtype) -> bool:
    return dtype.kind in "fiu" and not dtype.hasobject and dtype.fields is None and dtype.subdtype is None


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, shape: tuple[int, ...] | None, where: str,
                 kinds: str = "fiu") -> np.ndarray:
    """One array, after checking its header: numeric dtype, the expected shape (None: 1-D) and a size that fits
    what the zip declares for the member."""
    with zf.open(info) as fp:
        got, dtype = _read_header(fp, where)
        if not _numeric(dtype) or dtype.kind not in kinds:
            raise CheckpointError(f"{where}: dtype {dtype} is not allowed (numeric arrays only)")
        if dtype.kind == "f" and dtype.itemsize not in (4, 8):  # (float16 and long double: 255 MiB of float16
            # became 1.3 GB as the float64 the layers are kept in, past the size limit, which counts declared bytes)
            raise CheckpointError(f"{where}: dtype {dtype} is not allowed (float32 or float64 weights)")
        if shape is None and len(got) != 1 or shape is not None and got != shape:
            raise CheckpointError(f"{where}: shape {got}, expected {shape if shape is not None else '1-D'}")
        nbytes = int(np.prod(got, dtype=np.int64)) * dtype.itemsize
        if nbytes > info.file_size:
            raise CheckpointError(f"{where}: header declares {nbytes} bytes, the member holds {info.file_size}")
    with zf.open(info) as fp:
        try:
            arr = npy_format.read_array(fp, allow_pickle=False, max_header_size=10_000)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise CheckpointError(f"{where}: unreadable ({str(e).splitlines()[0][:200]})") from None
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise CheckpointError(f"{where}: NaN or infinite values")
    return arr


def open_regular(path: Path, max_bytes: int, what: str) -> io.BufferedReader:
    try:
        f = open(path, "rb", opener=nonblocking_opener)
    except FileNotFoundError:
        raise CheckpointError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise CheckpointError(f"{what} {path}: is a directory") from None
    except OSError as e:
        raise CheckpointError(f"{what} {path}: cannot read ({e.strerror})") from None
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise CheckpointError(f"{what} {path}: not a regular file")
    if st.st_size > max_bytes:
        f.close()
        raise CheckpointError(f"{what} {path}: {st.st_size} bytes, more than the limit of {max_bytes}")
    return f


def zip_directory(f: io.BufferedReader) -> tuple[int, int] | None:
    """(members, bytes) of the zip's central directory as its end record declares them (zip64's markers read as
    the largest values; (-1, -1): a zip64 archive), or None when there is no end record (zipfile then says what
    is wrong)."""
    size = f.seek(0, 2)
    n = min(size, 22 + 0xFFFF)  # the end record (22 bytes) and its comment (at most 64 KiB)
    f.seek(size - n)
    tail = f.read(n)
    f.seek(0)
    i = tail.rfind(b"PK\x05\x06")
    if i < 0 or i + 22 > len(tail):
        return None
    if i >= 20 and tail[i - 20:i - 16] == b"PK\x06\x07":  # a zip64 locator: its own counts, which zipfile follows
        # (1.2 million members behind a classic record that said 1: 13 s and 591 MB before the refusal). A
        # checkpoint (numpy's savez of a few arrays) never needs zip64's end records.
        return -1, -1
    return int.from_bytes(tail[i + 10:i + 12], "little"), int.from_bytes(tail[i + 12:i + 16], "little")


def _is_sb3_zip(names: list[str]) -> bool:
    return "data" in names and any(n.endswith(".pth") for n in names)


def load_policy(path: str | os.PathLike, *, level: str | None = None, card: bool = True,
                max_file_bytes: int = MAX_FILE_BYTES,
                max_uncompressed_bytes: int = MAX_UNCOMPRESSED_BYTES) -> NumpyPolicy:
    """Load a checkpoint written by ``save_policy`` (``fleetwise.learn.export``) after the checks of the module
    docstring; ``level``: the decision level it must decide; ``card``: the model card must be there and agree.
    Anything else (an SB3 zip, a pickle, a zip bomb, arrays of objects) raises ``CheckpointError``, one line."""
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointError(f"checkpoint {path!r:.60}: expected a path")
    if level is not None and level not in LEVELS:  # (said "a router policy, expected a nope policy")
        raise CheckpointError(f"level {level!r:.40}: expected None or one of {', '.join(LEVELS)}")
    p = Path(path)
    where = f"checkpoint {p}"
    with open_regular(p, max_file_bytes, "checkpoint") as f:
        d = zip_directory(f)
        if d == (-1, -1):
            raise CheckpointError(f"{where}: a zip64 archive (its own member counts): not a policy checkpoint, which "
                                  "numpy's savez writes as a plain zip")
        if d is not None and (d[0] > MAX_MEMBERS or d[1] > MAX_DIRECTORY_BYTES):
            raise CheckpointError(f"{where}: a zip of {d[0]:,} members ({d[1]:,}-byte directory), more than a policy "
                                  f"checkpoint holds (at most {MAX_MEMBERS} members, {MAX_DIRECTORY_BYTES:,} bytes)")
        try:
            zf = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError):
            raise CheckpointError(f"{where}: not a fleetwise policy checkpoint (.npz); {HOW_TO_EXPORT}") from None
        with zf:
            infos = zf.infolist()
            names = [i.filename for i in infos]
            if _is_sb3_zip(names):
                raise CheckpointError(f"{where}: a Stable-Baselines3 zip, which runs code when loaded; serving loads "
                                      f"only fleetwise policy checkpoints (NAME.npz + NAME.card.json): "
                                      f"{HOW_TO_EXPORT}")
            if len(set(names)) != len(names):
                raise CheckpointError(f"{where}: duplicate zip members")
            by_name = {n: i for n, i in zip(names, infos)}
            if "__meta__.npy" not in by_name:
                raise CheckpointError(f"{where}: no __meta__ entry: not a fleetwise policy checkpoint; "
                                      f"{HOW_TO_EXPORT}")
            total = 0
            for i in infos:
                if i.flag_bits & 0x1:
                    raise CheckpointError(f"{where}: encrypted zip member {i.filename!r}")
                if i.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise CheckpointError(f"{where}: member {i.filename!r} uses compression {i.compress_type} "
                                          "(stored or deflated only)")
                total += i.file_size
            if total > max_uncompressed_bytes:
                raise CheckpointError(f"{where}: {total} bytes uncompressed, more than the limit of "
                                      f"{max_uncompressed_bytes}")
            mi = by_name["__meta__.npy"]
            if mi.file_size > MAX_META_BYTES:
                raise CheckpointError(f"{where}: __meta__ is larger than {MAX_META_BYTES} bytes")
            raw = _read_member(zf, mi, None, f"{where}: __meta__", kinds="u")
            if raw.dtype != np.uint8:
                raise CheckpointError(f"{where}: __meta__ must be uint8 (UTF-8 JSON bytes)")
            try:
                meta = json.loads(raw.tobytes().decode("utf-8"), parse_constant=_reject_constant, parse_int=_parse_int,
                                  parse_float=finite_float, object_pairs_hook=unique_pairs)
            except (UnicodeDecodeError, ValueError, RecursionError) as e:
                raise CheckpointError(f"{where}: __meta__ is not valid UTF-8 JSON ({str(e)[:200]})") from None
            shapes = expected_arrays(meta, where)
            want = {f"{k}.npy" for k in shapes} | {"__meta__.npy"}
            if set(names) != want:
                odd = sorted(set(names) ^ want)[0]
                kind = "unexpected" if odd in set(names) else "missing"
                raise CheckpointError(f"{where}: {kind} member {odd!r} (the metadata calls for "
                                      f"{len(want)} arrays)")
            arrays = {k: _read_member(zf, by_name[f"{k}.npy"], s, f"{where}: {k}", kinds="f")
                      for k, s in shapes.items()}
    if level is not None and meta["level"] != level:
        raise CheckpointError(f"{where}: a {meta['level']} policy, expected a {level} policy")
    mc = None
    if card:
        mc = read_card(card_path(p))
        if mc.level != meta["level"]:
            raise CheckpointError(f"{where}: its model card says level {mc.level!r}, the checkpoint {meta['level']!r}")
    _check_bounds(arrays, where)
    return NumpyPolicy(meta, arrays, mc, p)


def _check_bounds(arrays: dict[str, np.ndarray], where: str) -> None:
    if "act_low" in arrays and not (arrays["act_low"] <= arrays["act_high"]).all():
        raise CheckpointError(f"{where}: action bounds with low > high")
    if "obs_var" in arrays and (arrays["obs_var"] < 0).any():
        raise CheckpointError(f"{where}: negative observation variance")


# --------------------------------------------------------------------------------------------- saving
def save_policy(path: str | os.PathLike, *, level: str, algorithm: str, obs_low: np.ndarray, obs_high: np.ndarray,
                action: ActionSpec, layers: list[tuple[np.ndarray, np.ndarray]], activation: str, card: ModelCard,
                act_low: np.ndarray | None = None, act_high: np.ndarray | None = None,
                obs_norm: dict[str, float] | None = None, obs_mean: np.ndarray | None = None,
                obs_var: np.ndarray | None = None) -> Path:
    """Write ``path`` (``.npz`` added if missing) and its model card, each atomically; returns the .npz path.
    Infinite observation bounds are stored as +-float32 max. The result is checked by ``load_policy``."""
    p = Path(path)
    if not p.name.endswith(SUFFIX):
        p = p.with_name(p.name + SUFFIX)
    hidden = [int(w.shape[0]) for w, _ in layers[:-1]]
    meta = {"format": FORMAT, "version": VERSION, "level": level, "algorithm": algorithm,
            "observation": {"shape": [int(x) for x in np.shape(obs_low)]}, "action": action.to_json(),
            "network": {"hidden": hidden, "activation": activation}, "obs_norm": obs_norm}
    big = float(np.finfo(np.float32).max)
    arrays: dict[str, np.ndarray] = {
        "obs_low": np.nan_to_num(np.asarray(obs_low, np.float32), neginf=-big, posinf=big),
        "obs_high": np.nan_to_num(np.asarray(obs_high, np.float32), neginf=-big, posinf=big)}
    for i, (w, b) in enumerate(layers):
        arrays[f"layer{i}_w"] = np.asarray(w, np.float32)
        arrays[f"layer{i}_b"] = np.asarray(b, np.float32)
    if act_low is not None:
        arrays["act_low"] = np.asarray(act_low, np.float32)
        arrays["act_high"] = np.asarray(act_high, np.float32)
    if obs_norm is not None:
        arrays["obs_mean"] = np.asarray(obs_mean, np.float32)
        arrays["obs_var"] = np.asarray(obs_var, np.float32)
    expected = expected_arrays(meta, f"checkpoint {p}")
    for k, shape in expected.items():
        if k not in arrays or arrays[k].shape != shape:
            raise ValueError(f"checkpoint {p}: array {k} has shape {arrays[k].shape if k in arrays else None}, "
                             f"expected {shape}")
    if set(arrays) != set(expected):
        raise ValueError(f"checkpoint {p}: arrays {sorted(set(arrays) ^ set(expected))} do not fit the metadata")
    if card.level != level:
        raise ValueError(f"model card level {card.level!r} differs from the checkpoint's {level!r}")
    p.parent.mkdir(parents=True, exist_ok=True)
    meta_bytes = np.frombuffer(json.dumps(meta, allow_nan=False).encode("utf-8"), np.uint8)
    # the card is made before anything is written: an interval that is not defined (one validation run) is null,
    # not NaN (which is no JSON), and a folder where the card goes fails before the checkpoint is written
    card_bytes = json.dumps(json_safe(card.to_json()), indent=1, allow_nan=False).encode("utf-8") + b"\n"
    cp = card_path(p)
    for q in (p, cp):
        if q.is_dir():
            raise CheckpointError(f"{q}: is a folder; the checkpoint and its model card are files")
        check_replaceable(q)
    # both files are written beside the targets under temporary names and read back as load_policy reads them;
    # only then do they replace the targets, so a save that fails (NaN weights, inverted bounds, a bad card) leaves
    # the checkpoint that was there (it used to be overwritten first and checked after)
    tmp = p.with_name(f".{p.name[: -len(SUFFIX)]}.{os.getpid()}.tmp{SUFFIX}")
    tmp_card = card_path(tmp)
    try:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, __meta__=meta_bytes, **arrays)
        tmp_card.write_bytes(card_bytes)
        load_policy(tmp)  # what was written reads back
        os.replace(tmp, p)
        os.replace(tmp_card, cp)
    finally:
        for q in (tmp, tmp_card):
            if q.exists():
                q.unlink()
    return p


# --------------------------------------------------------------------------------------------- confinement
def resolve_inside(folder: str | os.PathLike | None, name: str | os.PathLike, what: str = "checkpoint") -> Path:
    """``name`` resolved inside ``folder`` (relative names are relative to it); its real path (symlinks followed)
    must lie inside the folder's real path, and so must its model card's. ``folder`` None: refused (no folder was
    named at start)."""
    if folder is None:
        raise CheckpointError(f"{what} {str(name)!r}: loading by path is refused: start the service with "
                              "--checkpoint-dir DIR and name a file inside it")
    s = str(name)
    if not s or "\x00" in s:
        raise CheckpointError(f"{what}: expected a file name inside the checkpoint folder")
    root = os.path.realpath(folder)
    cand = os.path.join(root, s)
    # the file the loaders will open: a name without the suffix that is not a file gets it, as the policies add it
    # (checked before, the name was; then the policy added ".npz" and followed a link out of the folder)
    if not s.endswith(SUFFIX) and not os.path.lexists(cand):
        cand += SUFFIX
    real = os.path.realpath(cand)
    if os.path.commonpath([root, real]) != root or real == root:
        raise CheckpointError(f"{what} {s!r}: outside the checkpoint folder {root} (symlinks followed)")
    card = os.path.realpath(card_path(real))  # (the card is read too: a link out of the folder was followed)
    if os.path.commonpath([root, card]) != root:
        raise CheckpointError(f"{what} {s!r}: its model card {card_path(real).name} is outside the checkpoint "
                              f"folder {root} (symlinks followed)")
    return Path(real)
