"""The retained ``cluster/state`` snapshot's wire form: packed columns, deflated.

The snapshot holds every node, every link and the last few policies, so its plain JSON grows
by about 1 KB per node (the node's record, three links with their metrics, and its share of
nine copies of the policy) and passed ``MAX_PAYLOAD`` at a few hundred nodes. It is also
delivered to every node on every membership change, so its size times N is the broker's
largest load term. This module gives it a lossless compact form:

- node ids are interned once (``ids``), and everything else refers to them by index;
- nodes and links are columns (one list per field), so that zlib sees runs of alike values;
- times that are whole milliseconds (the scheduler keeps them so) are integer deltas;
- a node's ``neighbors`` is omitted when it is what its links say, and a ``data_addr`` that
  is ``addr:port`` is the port;
- each policy is stored as its difference from the one before (they differ by the nodes and
  tree edges a change touched), and a policy's ``addrs`` only where they differ from the
  node records' ``data_addr``.

:func:`pack` and :func:`unpack` are pure functions between the plain dict of a
:class:`~daemon.contracts.messages.ClusterState` (as ``dataclasses.asdict`` makes it) and
the packed dict, and ``unpack(pack(d)) == d`` for every valid snapshot. Anything that does
not fit a column's shape is carried as it is, so packing never loses a value. ``unpack``
trusts nothing: a malformed packed dict raises ``ValueError`` (the caller turns it into a
``MessageError``), and the plain dict it returns is then validated like any message.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

_MS_MAX = 2**52  # |value in ms| below this: k / 1000 round-trips exactly
_POLICY_SETS = ("members", "edges")


# --- numbers ------------------------------------------------------------------------------
def _ms(value: Any) -> int | None:
    """``value`` in whole milliseconds if that is exact, else None."""
    if not isinstance(value, float) or value != value or abs(value) * 1000 >= _MS_MAX:
        return None
    k = round(value * 1000)
    return k if k / 1000 == value else None


def _pack_times(values: Sequence[Any]) -> list[Any]:
    """Whole-ms floats as the int delta (ms) from the previous one; other floats and null
    as they are (JSON writes a float with a point or an exponent, so it never reads back
    as an int); anything else wrapped in a one-item list."""
    out: list[Any] = []
    prev = 0
    for v in values:
        k = _ms(v)
        if k is None:
            out.append(v if v is None or isinstance(v, float) else [v])
        else:
            out.append(k - prev)
            prev = k
    return out


def _unpack_times(col: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    prev = 0
    for v in col:
        if isinstance(v, int) and not isinstance(v, bool):
            prev += v
            if abs(prev) >= _MS_MAX:
                raise ValueError("time out of range")
            out.append(prev / 1000)
        else:
            out.append(_not_ms(v))
    return out


def _not_ms(v: Any) -> Any:
    """A packed time that was not whole milliseconds: a float as it was, or any other value
    wrapped in a one-element list (so that it cannot read as a delta)."""
    if isinstance(v, list):
        (raw,) = v
        return raw
    return v


def _deltas(values: Sequence[int]) -> list[int]:
    return [v - p for p, v in zip([0, *values], values, strict=False)]


def _undeltas(col: Sequence[Any]) -> list[int]:
    out, acc = [], 0
    for d in col:
        acc += _int(d)
        out.append(acc)
    return out


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("expected an integer")
    return value


# --- ids ----------------------------------------------------------------------------------
class _Ids:
    """Interned node ids: the nodes in the snapshot's order (the order they joined, which is
    the order their links were made in, so indices and their deltas stay small), then any
    other id named, sorted."""

    def __init__(self, nodes: list[str], others: set[str]) -> None:
        self.names = [*nodes, *sorted(others - set(nodes))]
        self.index = {n: i for i, n in enumerate(self.names)}


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def _is_edge_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e)
        for e in value)


def _is_addrs(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _policy_names(doc: Any) -> set[str]:
    """The node ids a policy document names (where it has the expected shape)."""
    if not isinstance(doc, dict):
        return set()
    names: set[str] = set()
    if _is_str_list(doc.get("members")):
        names.update(doc["members"])
    if _is_edge_list(doc.get("edges")):
        names.update(x for e in doc["edges"] for x in e)
    if _is_addrs(doc.get("addrs")):
        names.update(doc["addrs"])
    return names


# --- policies -----------------------------------------------------------------------------
Idx = list[Any]  # a policy's members (ints) or edges (int pairs) as indices


def _sorted_unique(items: list[Any]) -> bool:
    return all(x < y for x, y in itertools.pairwise(items))


def _flatten(items: Idx, pairs: bool) -> list[int]:
    if not pairs:
        return _deltas(items)
    return [x for a, b in items for x in (a, b)]


def _unflatten(col: Any, pairs: bool) -> Idx:
    if not isinstance(col, list):
        raise ValueError("expected a list")
    if not pairs:
        return _undeltas(col)
    if len(col) % 2:
        raise ValueError("odd pair list")
    return [(_int(col[i]), _int(col[i + 1])) for i in range(0, len(col), 2)]


class _Sets:
    """Members and edges of successive policies. A policy's are sorted by id and unique, so
    one is carried as what it adds to and drops from the one before, or (edges) as the
    positions of its edges in the link list; either way the receiver sorts them back."""

    def __init__(self, names: list[str], links: list[tuple[int, int]]) -> None:
        self.names = names
        self.link_pos: dict[tuple[int, int], int] = {}
        for i, pair in enumerate(links):
            self.link_pos.setdefault(pair, i)
        self.links = links

    def order(self, items: Idx, pairs: bool) -> Idx:
        """``items`` sorted as their ids sort."""
        name = self.names
        if pairs:
            return sorted(items, key=lambda e: (name[_index(e[0])], name[_index(e[1])]))
        return sorted(items, key=lambda i: name[_index(i)])

    def pack(self, items: Idx, sorted_ok: bool, base: Idx | None, pairs: bool
             ) -> dict[str, Any]:
        if sorted_ok and base is not None:
            now, was = set(items), set(base)
            return {"add": _flatten(self.order(list(now - was), pairs), pairs),
                    "del": _flatten(self.order(list(was - now), pairs), pairs)}
        if sorted_ok and pairs and all(e in self.link_pos for e in items):
            return {"lk": _deltas(sorted(self.link_pos[e] for e in items))}
        return {"all": _flatten(items, pairs)}

    def unpack(self, doc: Any, base: Idx | None, pairs: bool) -> Idx:
        if not isinstance(doc, dict):
            raise ValueError("bad member or edge set")
        if "all" in doc:
            return _unflatten(doc["all"], pairs)
        if "lk" in doc:
            if not pairs:
                raise ValueError("members as link positions")
            return self.order([self.links[_index(i)] for i in _undeltas(doc["lk"])], pairs)
        if base is None:
            raise ValueError("a diff with nothing to apply it to")
        gone = set(_unflatten(doc.get("del"), pairs))
        return self.order(list((set(base) - gone) | set(_unflatten(doc.get("add"), pairs))),
                          pairs)


class _PolicyPacker:
    """Packs policies oldest first, each against the one before."""

    def __init__(self, ids: _Ids, sets: _Sets, data_addr: dict[str, str]) -> None:
        self.ids, self.sets, self.data_addr = ids, sets, data_addr
        self.members: Idx | None = None  # the previous policy's, where sorted and unique
        self.edges: Idx | None = None

    def pack(self, doc: Any) -> dict[str, Any]:
        if not isinstance(doc, dict):
            self.members = self.edges = None
            return {"raw": doc}
        of = self.ids.index
        out: dict[str, Any] = {}
        rest: dict[str, Any] = {}
        members: Idx | None = None
        edges: Idx | None = None
        for key, value in doc.items():
            if key == "members" and _is_str_list(value):
                idx = [of[x] for x in value]
                ok = _sorted_unique(value)
                out["m"] = self.sets.pack(idx, ok, self.members, pairs=False)
                members = idx if ok else None
            elif key == "edges" and _is_edge_list(value):
                pidx: Idx = [(of[a], of[b]) for a, b in value]
                ok = _sorted_unique([(a, b) for a, b in value])
                out["e"] = self.sets.pack(pidx, ok, self.edges, pairs=True)
                edges = pidx if ok else None
            elif key == "addrs" and _is_addrs(value):
                # The keys in order (0: the members', as they always are); the values only
                # where the node record's differs.
                keys = list(value)
                out["ak"] = 0 if keys == doc.get("members") else _deltas(
                    [of[k] for k in keys])
                out["av"] = {str(of[k]): v for k, v in value.items()
                             if self.data_addr.get(k) != v}
            else:
                rest[key] = value
        out["r"] = rest
        self.members, self.edges = members, edges
        return out


class _PolicyUnpacker:
    """The inverse of :class:`_PolicyPacker`."""

    def __init__(self, sets: _Sets, data_addr: dict[str, str]) -> None:
        self.sets, self.names, self.data_addr = sets, sets.names, data_addr
        self.members: Idx | None = None
        self.edges: Idx | None = None

    def unpack(self, doc: Any) -> Any:
        if not isinstance(doc, dict):
            raise ValueError("bad policy")
        if "raw" in doc:
            self.members = self.edges = None
            return doc["raw"]
        rest = doc.get("r")
        if not isinstance(rest, dict):
            raise ValueError("bad policy")
        out = dict(rest)
        name = self.names
        members: Idx | None = None
        edges: Idx | None = None
        member_idx: Idx | None = None
        if "m" in doc:
            member_idx = self.sets.unpack(doc["m"], self.members, pairs=False)
            out["members"] = [name[_index(i)] for i in member_idx]
            members = member_idx if _sorted_unique(out["members"]) else None
        if "e" in doc:
            pairs = self.sets.unpack(doc["e"], self.edges, pairs=True)
            out["edges"] = [[name[_index(a)], name[_index(b)]] for a, b in pairs]
            edges = pairs if _sorted_unique([(a, b) for a, b in out["edges"]]) else None
        if "ak" in doc:
            diff = doc.get("av")
            if not isinstance(diff, dict):
                raise ValueError("bad policy addrs")
            addrs = {}
            keys = doc["ak"]
            if keys == 0 and not isinstance(keys, bool):
                if member_idx is None:
                    raise ValueError("addrs keyed as members without members")
                keys = member_idx
            else:
                keys = _undeltas(keys)
            for i in keys:
                node = name[_index(i)]
                addrs[node] = diff[str(i)] if str(i) in diff else self.data_addr[node]
            out["addrs"] = addrs
        self.members, self.edges = members, edges
        return out


def _index(i: int) -> int:
    if i < 0:  # a negative index would read from the end of the table
        raise ValueError("negative id index")
    return i


# --- nodes and links ----------------------------------------------------------------------
NODE_FIELDS = ("state", "addr", "neighbors", "incarnation", "joined_at", "since", "step",
               "data_addr", "heard_at")
LINK_FIELDS = ("a", "b", "state", "rtt_ms", "bandwidth_mbps", "measured_at")
_NODE_TIMES = ("joined_at", "since", "heard_at")


def _derived_neighbors(links: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each node's neighbours as its links say (what the scheduler sets them to)."""
    out: dict[str, set[str]] = {}
    for lk in links:
        a, b = lk["a"], lk["b"]
        out.setdefault(a, set()).add(b)
        out.setdefault(b, set()).add(a)
    return {n: sorted(s) for n, s in out.items()}


def _port_of(addr: str, data_addr: str) -> int | None:
    """The port when ``data_addr`` is exactly ``addr:port``."""
    if not addr or not data_addr.startswith(addr + ":"):
        return None
    tail = data_addr[len(addr) + 1:]
    if not tail.isdigit() or not tail.isascii() or str(int(tail)) != tail:
        return None
    return int(tail)


def _pack_nodes(nodes: dict[str, dict[str, Any]], ids: _Ids,
                derived: dict[str, list[str]]) -> dict[str, Any]:
    recs = list(nodes.values())
    cols: dict[str, Any] = {"id": _deltas([ids.index[n] for n in nodes])}
    for key in ("state", "incarnation", "step"):
        cols[key] = [r[key] for r in recs]
    cols["addr"] = [r["addr"] for r in recs]
    cols["data_addr"] = [p if (p := _port_of(r["addr"], r["data_addr"])) is not None
                         else r["data_addr"] for r in recs]
    # null: the neighbours its links give; else the list (as indices).
    cols["neighbors"] = [None if r["neighbors"] == derived.get(n, []) else
                         [ids.index[x] for x in r["neighbors"]] for n, r in nodes.items()]
    for key in _NODE_TIMES:
        cols[key] = _pack_times([r[key] for r in recs])
    # A state change is usually long after the join, but the first one is at it: since is
    # packed as its own delta from joined_at, so that zero when they agree.
    cols["since"] = [_since_delta(r["joined_at"], r["since"]) for r in recs]
    return cols


def _since_delta(joined: Any, since: Any) -> Any:
    a, b = _ms(joined), _ms(since)
    if a is None or b is None:
        return since if isinstance(since, float) else [since]
    return b - a


def _unpack_since(joined: list[Any], col: list[Any]) -> list[Any]:
    out: list[Any] = []
    for j, v in zip(joined, col, strict=True):
        if isinstance(v, int) and not isinstance(v, bool):
            a = _ms(j)
            if a is None or abs(a + v) >= _MS_MAX:
                raise ValueError("since without a joined_at")
            out.append((a + v) / 1000)
        else:
            out.append(_not_ms(v))
    return out


def _pack_links(links: list[dict[str, Any]], ids: _Ids) -> dict[str, Any]:
    # Each end as its delta from the same end of the link before: a node's links are made
    # together (when it joins), so one of the two repeats and packs to almost nothing.
    ends = [(ids.index[lk["a"]], ids.index[lk["b"]]) for lk in links]
    return {"a": _deltas([a for a, _ in ends]),
            "b": _deltas([b for _, b in ends]),
            "state": [lk["state"] for lk in links],
            "rtt_ms": [lk["rtt_ms"] for lk in links],
            "bandwidth_mbps": [lk["bandwidth_mbps"] for lk in links],
            "measured_at": _pack_times([lk["measured_at"] for lk in links])}


def _columns(doc: Any, fields: Sequence[str]) -> tuple[int, dict[str, list[Any]]]:
    if not isinstance(doc, dict) or any(not isinstance(doc.get(f), list) for f in fields):
        raise ValueError("bad columns")
    sizes = {len(doc[f]) for f in fields}
    if len(sizes) != 1:
        raise ValueError("columns of unequal length")
    return sizes.pop(), doc


def _unpack_links(doc: Any, name: list[str]
                  ) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    n, cols = _columns(doc, LINK_FIELDS)
    at = _unpack_times(cols["measured_at"])
    a_ix = _undeltas(cols["a"])
    b_ix = _undeltas(cols["b"])
    return [{"a": name[_index(a_ix[i])], "b": name[_index(b_ix[i])],
             "state": cols["state"][i], "rtt_ms": cols["rtt_ms"][i],
             "bandwidth_mbps": cols["bandwidth_mbps"][i], "measured_at": at[i]}
            for i in range(n)], list(zip(a_ix, b_ix, strict=True))


def _unpack_nodes(doc: Any, name: list[str],
                  derived: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    _, cols = _columns(doc, ("id", *NODE_FIELDS))
    times = {key: _unpack_times(cols[key]) for key in ("joined_at", "heard_at")}
    times["since"] = _unpack_since(times["joined_at"], cols["since"])
    out: dict[str, dict[str, Any]] = {}
    for i, idx in enumerate(_undeltas(cols["id"])):
        node = name[_index(idx)]
        addr, data, nbrs = cols["addr"][i], cols["data_addr"][i], cols["neighbors"][i]
        if isinstance(data, int) and not isinstance(data, bool):
            if not isinstance(addr, str):
                raise ValueError("a port without an address")
            data = f"{addr}:{data}"
        out[node] = {
            "state": cols["state"][i], "addr": addr,
            "neighbors": list(derived.get(node, [])) if nbrs is None
            else [name[_index(_int(x))] for x in nbrs],
            "incarnation": cols["incarnation"][i], "joined_at": times["joined_at"][i],
            "since": times["since"][i], "step": cols["step"][i], "data_addr": data,
            "heard_at": times["heard_at"][i]}
    return out


# --- the snapshot -------------------------------------------------------------------------
def pack(doc: dict[str, Any]) -> dict[str, Any]:
    """The packed form of a snapshot's plain dict (``nodes``, ``links``, ``events``,
    ``policy``, ``policies``; other keys are left to the caller)."""
    nodes: dict[str, dict[str, Any]] = doc["nodes"]
    links: list[dict[str, Any]] = doc["links"]
    names = {x for lk in links for x in (lk["a"], lk["b"])}
    names.update(x for r in nodes.values() for x in r["neighbors"])
    for pol in (*doc["policies"], doc["policy"]):
        names |= _policy_names(pol)
    ids = _Ids(list(nodes), names)
    derived = _derived_neighbors(links)
    data_addr = {n: r["data_addr"] for n, r in nodes.items()}
    pairs = [(ids.index[lk["a"]], ids.index[lk["b"]]) for lk in links]
    packer = _PolicyPacker(ids, _Sets(ids.names, pairs), data_addr)
    policies = [packer.pack(p) for p in doc["policies"]]
    same = bool(doc["policies"]) and doc["policy"] == doc["policies"][-1]
    return {"ids": ids.names, "nodes": _pack_nodes(nodes, ids, derived),
            "links": _pack_links(links, ids), "events": doc["events"],
            "policies": policies,
            "policy": {"same": True} if same else packer.pack(doc["policy"])}


def unpack(doc: Any) -> dict[str, Any]:
    """The plain dict of a packed snapshot, not yet validated.

    Raises:
        ValueError: The packed form is malformed (any inconsistency, not only a type).
    """
    try:
        return _unpack(doc)
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed packed state: {type(exc).__name__}") from None


def _unpack(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict) or not _is_str_list(doc.get("ids")):
        raise ValueError("no id table")
    name: list[str] = doc["ids"]
    links, pairs = _unpack_links(doc["links"], name)
    nodes = _unpack_nodes(doc["nodes"], name, _derived_neighbors(links))
    data_addr = {n: r["data_addr"] for n, r in nodes.items()}
    unpacker = _PolicyUnpacker(_Sets(name, pairs), data_addr)
    if not isinstance(doc["policies"], list):
        raise ValueError("bad policies")
    policies = [unpacker.unpack(p) for p in doc["policies"]]
    pol = doc["policy"]
    if isinstance(pol, dict) and pol.get("same") is True:
        if not policies:
            raise ValueError("no policy to repeat")
        policy = policies[-1]
        policy = dict(policy) if isinstance(policy, dict) else policy
    else:
        policy = unpacker.unpack(pol)
    return {"nodes": nodes, "links": links, "events": doc["events"], "policies": policies,
            "policy": policy}
