"""Requests and workloads.

A ``Request`` is the user-facing record of one inference request. A ``Workload`` holds many of them as
columns (numpy arrays), which is what the simulator consumes: a million requests cost a few arrays, not a
million objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np


@dataclass(slots=True)
class Request:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    origin: str = "default"  # region the request comes from
    model: str = "default"  # model name (catalog key) or "default" = the scenario's model
    slo_class: str = "standard"
    priority: int = 0  # larger = more important
    tenant: str = "default"
    prefix_block_ids: tuple[int, ...] | None = None  # prefix-cache block hashes (Mooncake hash_ids)


@dataclass(slots=True)
class Workload:
    """Requests as columns, sorted by arrival time.

    Categorical columns (origin, model, slo_class, tenant) are small integer codes into the name lists.
    Prefix block ids are stored CSR-style: request i's blocks are
    ``prefix_blocks[prefix_offsets[i]:prefix_offsets[i+1]]``, each block covering ``block_tokens`` tokens.
    """

    arrival_s: np.ndarray  # float64
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    origin: np.ndarray = None  # int16 codes into origins
    model: np.ndarray = None  # int16 codes into models
    slo_class: np.ndarray = None  # int16 codes into slo_classes
    priority: np.ndarray = None  # int16
    tenant: np.ndarray = None  # int16 codes into tenants
    origins: list[str] = field(default_factory=lambda: ["default"])
    models: list[str] = field(default_factory=lambda: ["default"])
    slo_classes: list[str] = field(default_factory=lambda: ["standard"])
    tenants: list[str] = field(default_factory=lambda: ["default"])
    prefix_offsets: np.ndarray | None = None  # int64, len n+1
    prefix_blocks: np.ndarray | None = None  # int64
    block_tokens: int = 512
    name: str = "workload"

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        self.arrival_s = np.asarray(self.arrival_s, dtype=np.float64)
        self.prompt_tokens = np.asarray(self.prompt_tokens, dtype=np.int64)
        self.output_tokens = np.asarray(self.output_tokens, dtype=np.int64)
        for col in ("origin", "model", "slo_class", "priority", "tenant"):
            v = getattr(self, col)
            setattr(self, col, np.zeros(n, dtype=np.int16) if v is None else np.asarray(v, dtype=np.int16))
        if not (len(self.prompt_tokens) == len(self.output_tokens) == n):
            raise ValueError("Workload columns differ in length")

    def check(self, where: str = "workload") -> "Workload":
        """A workload a user built is one the simulator can run, or one InputError line naming what is wrong:
        arrivals finite, from 0 and sorted (an arrival before 0 or after a later one was never served, and not
        counted as rejected either), prompts of 1 to ``MAX_TOKENS`` tokens, outputs of 0 to ``MAX_TOKENS``
        (a negative one gave a negative throughput), codes within their name lists. Returns the workload."""
        from fleetwise.errors import InputError
        from fleetwise.limits import MAX_REQUESTS, MAX_SPAN_S, MAX_TOKENS

        n = len(self)
        if n > MAX_REQUESTS:
            raise InputError(f"{where}: {n:,} requests, more than {MAX_REQUESTS:,} (docs/limits.md)")

        def bad(col: str, mask: np.ndarray, what: str) -> None:
            if mask.any():
                i = int(np.argmax(mask))
                raise InputError(f"{where}: {col}[{i}] = {getattr(self, col)[i].item()!r}: expected {what}")

        a = self.arrival_s
        bad("arrival_s", ~np.isfinite(a) | (a < 0) | (a > MAX_SPAN_S), f"seconds from 0 to {MAX_SPAN_S:,.0f}")
        if n > 1:
            dec = np.zeros(n, bool)
            dec[1:] = a[1:] < a[:-1]
            bad("arrival_s", dec, "arrivals sorted in time (Workload.sorted())")
        bad("prompt_tokens", (self.prompt_tokens < 1) | (self.prompt_tokens > MAX_TOKENS),
            f"1 to {MAX_TOKENS:,} tokens")
        bad("output_tokens", (self.output_tokens < 0) | (self.output_tokens > MAX_TOKENS),
            f"0 to {MAX_TOKENS:,} tokens")
        for col, names in (("origin", "origins"), ("model", "models"), ("slo_class", "slo_classes"),
                           ("tenant", "tenants")):
            k = len(getattr(self, names))
            bad(col, (getattr(self, col) < 0) | (getattr(self, col) >= k), f"a code into {names} (0 to {k - 1})")
        if len(self.origin) != n or len(self.model) != n or len(self.slo_class) != n or len(self.priority) != n \
                or len(self.tenant) != n:
            raise InputError(f"{where}: its columns differ in length ({n} arrivals)")
        if self.prefix_offsets is not None:
            po = np.asarray(self.prefix_offsets)
            if len(po) != n + 1 or po[0] != 0 or np.any(np.diff(po) < 0) or po[-1] != len(self.prefix_blocks):
                raise InputError(f"{where}: prefix_offsets is not the CSR offsets of prefix_blocks (length n + 1, "
                                 "from 0, non-decreasing, ending at len(prefix_blocks))")
        return self

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def has_prefix(self) -> bool:
        return self.prefix_offsets is not None

    def prefix_of(self, i: int) -> np.ndarray:
        if self.prefix_offsets is None:
            return np.empty(0, dtype=np.int64)
        return self.prefix_blocks[self.prefix_offsets[i] : self.prefix_offsets[i + 1]]

    def request(self, i: int) -> Request:
        blocks = None
        if self.prefix_offsets is not None:
            blocks = tuple(int(b) for b in self.prefix_of(i))
        return Request(
            arrival_s=float(self.arrival_s[i]),
            prompt_tokens=int(self.prompt_tokens[i]),
            output_tokens=int(self.output_tokens[i]),
            origin=self.origins[self.origin[i]],
            model=self.models[self.model[i]],
            slo_class=self.slo_classes[self.slo_class[i]],
            priority=int(self.priority[i]),
            tenant=self.tenants[self.tenant[i]],
            prefix_block_ids=blocks,
        )

    def __iter__(self):
        return (self.request(i) for i in range(len(self)))

    def take(self, idx: np.ndarray | Sequence[int] | slice) -> "Workload":
        """A new workload with the selected rows (in the given order)."""
        idx = np.arange(len(self))[idx] if isinstance(idx, slice) else np.asarray(idx, dtype=np.int64)
        po = pb = None
        if self.prefix_offsets is not None:
            starts, ends = self.prefix_offsets[idx], self.prefix_offsets[idx + 1]
            lens = ends - starts
            po = np.zeros(len(idx) + 1, dtype=np.int64)
            np.cumsum(lens, out=po[1:])
            pb = np.concatenate([self.prefix_blocks[s:e] for s, e in zip(starts, ends)]) if len(idx) else np.empty(0, np.int64)
        return Workload(
            arrival_s=self.arrival_s[idx], prompt_tokens=self.prompt_tokens[idx], output_tokens=self.output_tokens[idx],
            origin=self.origin[idx], model=self.model[idx], slo_class=self.slo_class[idx],
            priority=self.priority[idx], tenant=self.tenant[idx],
            origins=list(self.origins), models=list(self.models), slo_classes=list(self.slo_classes),
            tenants=list(self.tenants), prefix_offsets=po, prefix_blocks=pb, block_tokens=self.block_tokens,
            name=self.name,
        )

    def head(self, n: int) -> "Workload":
        return self.take(slice(0, n))

    def sorted(self) -> "Workload":
        order = np.argsort(self.arrival_s, kind="stable")
        return self if np.all(order == np.arange(len(self))) else self.take(order)

    @classmethod
    def concat(cls, parts: Sequence["Workload"], name: str = "mix") -> "Workload":
        """One workload with the requests of all ``parts``, sorted by arrival (stable: ties keep part order).
        Categorical names are merged; prefix block ids are kept when every part has them."""
        parts = list(parts)
        if not parts:
            raise ValueError("concat: no workloads")
        cols: dict[str, list] = {}
        names: dict[str, list[str]] = {"origin": [], "model": [], "slo_class": [], "tenant": []}
        lists = {"origin": "origins", "model": "models", "slo_class": "slo_classes", "tenant": "tenants"}
        for k, attr in lists.items():
            codes = []
            for w in parts:
                remap = []
                for nm in getattr(w, attr):
                    if nm not in names[k]:
                        names[k].append(nm)
                    remap.append(names[k].index(nm))
                codes.append(np.asarray(remap, dtype=np.int16)[getattr(w, k)] if len(w) else np.zeros(0, np.int16))
            cols[k] = np.concatenate(codes)
        po = pb = None
        if all(w.has_prefix for w in parts):
            lens = np.concatenate([np.diff(w.prefix_offsets) for w in parts])
            po = np.zeros(len(lens) + 1, dtype=np.int64)
            np.cumsum(lens, out=po[1:])
            pb = np.concatenate([w.prefix_blocks for w in parts])
        w = cls(
            arrival_s=np.concatenate([w.arrival_s for w in parts]),
            prompt_tokens=np.concatenate([w.prompt_tokens for w in parts]),
            output_tokens=np.concatenate([w.output_tokens for w in parts]),
            origin=cols["origin"], model=cols["model"], slo_class=cols["slo_class"],
            priority=np.concatenate([w.priority for w in parts]), tenant=cols["tenant"],
            origins=names["origin"], models=names["model"], slo_classes=names["slo_class"], tenants=names["tenant"],
            prefix_offsets=po, prefix_blocks=pb, block_tokens=parts[0].block_tokens, name=name,
        )
        return w.sorted()

    @classmethod
    def from_requests(cls, requests: Iterable[Request], name: str = "requests", block_tokens: int = 512) -> "Workload":
        reqs = list(requests)
        cats: dict[str, list[str]] = {"origin": [], "model": [], "slo_class": [], "tenant": []}
        codes: dict[str, list[int]] = {k: [] for k in cats}
        for r in reqs:
            for k in cats:
                v = getattr(r, k)
                if v not in cats[k]:
                    cats[k].append(v)
                codes[k].append(cats[k].index(v))
        has_prefix = any(r.prefix_block_ids is not None for r in reqs)
        po = pb = None
        if has_prefix:
            lens = [len(r.prefix_block_ids or ()) for r in reqs]
            po = np.zeros(len(reqs) + 1, dtype=np.int64)
            np.cumsum(lens, out=po[1:])
            pb = np.array([b for r in reqs for b in (r.prefix_block_ids or ())], dtype=np.int64)
        w = cls(
            arrival_s=np.array([r.arrival_s for r in reqs], dtype=np.float64),
            prompt_tokens=np.array([r.prompt_tokens for r in reqs], dtype=np.int64),
            output_tokens=np.array([r.output_tokens for r in reqs], dtype=np.int64),
            origin=np.array(codes["origin"]), model=np.array(codes["model"]),
            slo_class=np.array(codes["slo_class"]), priority=np.array([r.priority for r in reqs]),
            tenant=np.array(codes["tenant"]),
            origins=cats["origin"] or ["default"], models=cats["model"] or ["default"],
            slo_classes=cats["slo_class"] or ["standard"], tenants=cats["tenant"] or ["default"],
            prefix_offsets=po, prefix_blocks=pb, block_tokens=block_tokens, name=name,
        )
        return w.sorted()
