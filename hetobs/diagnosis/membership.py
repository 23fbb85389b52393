"""Communicator membership written once per communicator (schema `hetobs.comm`, docs/dump-schema.md).

From dump schema 2.0 on, a dump's or rank file's comm entry carries only
`"membership": {"hash", "lowest_rank"}`; the member list and ring order live in
`comms/comm-<id>-<hash>.json`, written by the communicator's lowest rank. That file is
untrusted like every other: it is used only when its content hashes to the name every
referring rank gave (so a stale, edited or foreign file is never taken for the truth).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

from .job import MAX_WORLD_SIZE
from .summary import SchemaError, check_schema
from .types import CommKey
from .untrusted import SafeDir

__all__ = ["COMM_SCHEMA", "COMMS_DIR", "Membership", "membership_hash", "comm_file_name", "parse_comm_file",
           "members_of"]

COMM_SCHEMA = "hetobs.comm"
COMMS_DIR = "comms"


class Membership(NamedTuple):
    members: tuple[int, ...]  # global ranks in comm-rank order
    ring: tuple[int, ...]     # global ranks in ring order (data flows ring[i] -> ring[i+1])


def membership_hash(members: tuple[int, ...] | list[int], ring: tuple[int, ...] | list[int]) -> str:
    """What the native writer computes (state_json.cc membershipHash): 16 hex digits of SHA-256."""
    text = "global_ranks=" + ",".join(map(str, members)) + ";ring=" + ",".join(map(str, ring))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def comm_file_name(comm: CommKey, digest: str) -> str:
    return f"comm-{comm}-{digest}.json"


def _rank_list(doc: dict[str, Any], key: str) -> tuple[int, ...]:
    v = doc.get(key)
    if not isinstance(v, list) or not all(type(x) is int and 0 <= x < MAX_WORLD_SIZE for x in v):
        raise SchemaError(f"'{key}' is not a list of rank numbers")
    return tuple(v)


def parse_comm_file(raw: bytes, comm: CommKey, digest: str) -> Membership:
    """The membership in `raw`, checked against the comm id and hash the ranks referred to.

    Raises SchemaError (or ValueError for text that is not JSON) saying what is wrong."""
    doc = json.loads(raw)
    check_schema(doc, COMM_SCHEMA)
    if doc.get("comm_id") != comm:
        raise SchemaError(f"says comm_id {doc.get('comm_id')!r}, but its name says comm {comm}")
    members, ring = _rank_list(doc, "global_ranks"), _rank_list(doc, "ring")
    if len(set(members)) != len(members) or sorted(members) != sorted(ring):
        raise SchemaError("'ring' is not an ordering of 'global_ranks' (or a rank is listed twice)")
    if membership_hash(members, ring) != digest:
        raise SchemaError(f"its content does not hash to {digest}, the hash the ranks' dumps refer to "
                          f"(a stale, edited or damaged file)")
    return Membership(members, ring)


def members_of(job_dir: Path, entry: dict[str, Any]) -> Membership:
    """The membership of one comm entry of a dump or rank file, any version: the inline lists (1.x) or
    its checked file (2.x). Raises SchemaError / OSError naming what is wrong (for tools and tests; the
    loader reads the files itself, once per communicator)."""
    if "membership" not in entry:
        return Membership(_rank_list(entry, "global_ranks"), _rank_list(entry, "ring"))
    comm, ref = entry.get("comm_id"), entry.get("membership")
    digest = ref.get("hash") if isinstance(ref, dict) else None
    if type(comm) is not int or type(digest) is not str or not digest.isalnum():
        raise SchemaError(f"comm entry has no usable comm_id / membership hash: {entry.get('comm_id')!r}, {ref!r}")
    with SafeDir.open_root(Path(job_dir)) as root, root.subdir(COMMS_DIR) as folder:
        return parse_comm_file(folder.read(comm_file_name(comm, digest)), comm, digest)
