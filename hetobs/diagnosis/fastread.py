"""Read a big JSON dump without building a Python object per record.

Why: 16,384 ranks x 200 op records is 3.3 million dicts, and every dump repeats the
rank lists of its communicators (`global_ranks`, `ring`: 16,384 ints each). Parsing
all of it costs minutes and gigabytes; the diagnosis needs the header, the
communicator state and only the last few records. So, on the text:

- the value of every `"ring"` / `"global_ranks"` key (a plain list of ints) is cut
  out and interned: identical lists are parsed once for the whole job and shared;
- only the last `keep` elements of the top-level `"entries"` array are decoded,
  found by scanning backwards for `{` and proving each candidate: it must decode to
  a record-shaped dict, and only `,` / whitespace may lie between consecutive records
  and only `]` after the last. A `{` inside a JSON string can at most decode to `{}`
  (any quote inside a string is escaped), so candidates cannot be fooled by text.

Anything unexpected falls back to a plain `json.loads` of the whole document, so the
fast path can only be faster, never different (tests compare the two).
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

__all__ = ["IntListTable", "read_document", "TooDeep"]

_DECODER = json.JSONDecoder()
_INT_LIST_CHARS = str.maketrans("", "", "0123456789, \t\r\n-")
_GAP = re.compile(r"\s*,\s*\Z")
_CLOSE = re.compile(r"\s*\]")
_OPEN = re.compile(r"\s*:\s*\[")
_BIG_KEYS = ('"ring"', '"global_ranks"')
_REF = "__hetobs_intlist__"


class IntListTable:
    """Interned int lists, shared by every dump of a job (one tuple per distinct list)."""

    def __init__(self) -> None:
        self._by_text: dict[str, tuple[int, ...]] = {}
        self._recent: list[str] = []  # the last few distinct bodies, tried first

    def intern(self, text: str) -> tuple[int, ...]:
        found = self._by_text.get(text)
        if found is None:
            found = tuple(int(x) for x in json.loads("[" + text + "]"))
            self._by_text[text] = found
        return found

    def lookup(self, text: str) -> Optional[tuple[int, ...]]:
        """The interned list for this exact text, if seen before (then it was validated)."""
        return self._by_text.get(text)

    def match_at(self, text: str, lo: int) -> Optional[tuple[int, tuple[int, ...]]]:
        """(end offset, list) when a known list body starts at text[lo] and is followed by ']'.

        Every rank repeats the same rings, so this is almost always a hit, and a memcmp
        is much cheaper than scanning for ']' and hashing the body.
        """
        for body in self._recent:
            hi = lo + len(body)
            if text.startswith(body, lo) and text.startswith("]", hi):
                return hi, self._by_text[body]
        return None

    def remember(self, body: str) -> None:
        if body in self._recent:
            return
        self._recent.insert(0, body)
        del self._recent[4:]

    def __len__(self) -> int:
        return len(self._by_text)


def _unescaped(text: str, pos: int) -> bool:
    """Whether the quote at `pos` is structural (not preceded by an odd run of backslashes)."""
    n = 0
    while pos - 1 - n >= 0 and text[pos - 1 - n] == "\\":
        n += 1
    return n % 2 == 0


def _strip_int_lists(text: str, table: IntListTable, refs: list[tuple[int, ...]]) -> str:
    """Replace each ring/global_ranks list by a reference string `"__hetobs_intlist__<i>"`.

    One forward pass: each key's next occurrence is searched from the end of the last
    list cut, so list bodies are not rescanned once per key.
    """
    parts: list[str] = []
    prev = 0
    nxt = {key: text.find(key) for key in _BIG_KEYS}
    while True:
        live = [(p, k) for k, p in nxt.items() if p != -1]
        if not live:
            break
        pos, key = min(live)
        after = pos + len(key)
        m = _OPEN.match(text, after)
        if not m or not _unescaped(text, pos):
            nxt[key] = text.find(key, after)
            continue
        lo = m.end()
        hit = table.match_at(text, lo)
        if hit is not None:
            hi, known = hit
        else:
            hi = text.find("]", lo)
            if hi == -1:
                nxt[key] = -1
                continue
            body = text[lo:hi]
            if body.translate(_INT_LIST_CHARS):
                nxt[key] = text.find(key, after)
                continue  # not a plain int list: leave it to json
            known = table.intern(body)
            table.remember(body)
        refs.append(known)
        parts.append(text[prev:lo - 1])
        parts.append(f'"{_REF}{len(refs) - 1}"')
        prev = hi + 1
        for k in nxt:
            if nxt[k] != -1 and nxt[k] < prev:
                nxt[k] = text.find(k, prev)
    if not parts:
        return text
    parts.append(text[prev:])
    return "".join(parts)


def _restore(obj: Any, refs: list[tuple[int, ...]]) -> Any:
    """Put the interned tuples back where the references are (only where they were cut)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, str) and v.startswith(_REF):
                obj[k] = refs[int(v[len(_REF):])]
            elif isinstance(v, (dict, list)):
                _restore(v, refs)
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, (dict, list)):
                _restore(v, refs)
    return obj


def _restore_refs(doc: dict[str, Any], refs: list[tuple[int, ...]]) -> None:
    """Where the schema puts the lists (comms[*]) first; a full walk only if some are left."""
    left = len(refs)
    comms = doc.get("comms")
    if isinstance(comms, list):
        for c in comms:
            if isinstance(c, dict):
                for k in ("ring", "global_ranks"):
                    v = c.get(k)
                    if isinstance(v, str) and v.startswith(_REF):
                        c[k] = refs[int(v[len(_REF):])]
                        left -= 1
    if left:
        _restore(doc, refs)


def _is_record(obj: Any) -> bool:
    return (isinstance(obj, dict) and "record_id" in obj and "profiling_name" in obj
            and "peers" not in obj)


def _tail_entries(text: str, keep: int) -> Optional[tuple[int, int, list[dict[str, Any]], bool]]:
    """(array_open, array_close, last `keep` records oldest first, whole array seen) or None."""
    key = text.rfind('"entries"')  # the array is near the end: search backwards
    while key != -1 and not (_unescaped(text, key) and _OPEN.match(text, key + len('"entries"'))):
        key = text.rfind('"entries"', 0, key)
    if key == -1:
        return None
    m = _OPEN.match(text, key + len('"entries"'))
    if not m:
        return None
    open_pos = m.end() - 1
    found: list[tuple[int, int, dict[str, Any]]] = []  # right to left
    hi = len(text)
    close_pos = -1
    while len(found) < keep:
        pos = text.rfind("{", open_pos + 1, hi)
        if pos == -1:
            break
        hi = pos
        try:
            obj, end = _DECODER.raw_decode(text, pos)
        except ValueError:
            continue
        if not _is_record(obj):
            continue
        if not found:
            m2 = _CLOSE.match(text, end)
            if not m2:
                return None  # a record-shaped dict that does not end the array: unexpected layout
            close_pos = m2.end() - 1
        elif not _GAP.match(text[end:found[-1][0]]):
            continue  # a record nested in something else; keep looking left
        found.append((pos, end, obj))
    if not found:
        m3 = _CLOSE.match(text, open_pos + 1)
        if not m3:
            return None
        return open_pos, m3.end() - 1, [], True
    j = found[-1][0] - 1  # what precedes the leftmost record: '[' (all seen) or ',' (more to the left)
    while j > open_pos and text[j] in " \t\r\n":
        j -= 1
    complete = j == open_pos
    if not complete and (len(found) < keep or text[j] != ","):
        return None  # the leftmost record found is not the first element after a comma
    records = [obj for _, _, obj in reversed(found)]
    return open_pos, close_pos, records, complete


class TooDeep(ValueError):
    """The document nests deeper than the parser can follow (a real dump nests a few levels)."""


def read_document(raw: bytes, table: IntListTable, keep: int) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    """Decode a dump: (document without "entries", its last `keep` records, fast path used).

    Raises ValueError only (json.JSONDecodeError, TooDeep, or a too-long number), never
    RecursionError. Bytes that are not UTF-8 (old writers passed them through inside
    error texts) become U+FFFD instead of costing the whole dump.
    """
    bad_utf8: Optional[UnicodeDecodeError] = None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad_utf8 = e
        text = raw.decode("utf-8", errors="replace")
    try:
        return _read_document(text, table, keep)
    except RecursionError:
        raise TooDeep("JSON nested too deeply to be a dump") from None
    except json.JSONDecodeError:
        if bad_utf8 is not None:
            raise bad_utf8 from None  # not text at all: say so, not where the JSON parse gave up
        raise


def _read_document(text: str, table: IntListTable,
                   keep: int) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    tail = _tail_entries(text, keep) if keep > 0 else None
    records: Optional[list[dict[str, Any]]] = None
    head_text = text
    if tail is not None:
        open_pos, close_pos, records, _complete = tail
        head_text = text[:open_pos] + "[]" + text[close_pos + 1:]
    refs: list[tuple[int, ...]] = []
    try:
        head = json.loads(_strip_int_lists(head_text, table, refs))
    except ValueError:
        head = None  # let the plain parse below report the error as json.loads would
    if isinstance(head, dict):
        if refs:
            _restore_refs(head, refs)
        entries = head.pop("entries", None)
        if records is None:
            records = entries[-keep:] if isinstance(entries, list) and keep > 0 else []
        return head, records, tail is not None
    doc = json.loads(text)
    if not isinstance(doc, dict):
        return doc, [], False
    entries = doc.pop("entries", None)
    records = entries[-keep:] if isinstance(entries, list) and keep > 0 else []
    _intern_lists(doc, table)
    return doc, records, False


def _intern_lists(doc: Any, table: IntListTable) -> None:
    """Slow path: share ring/global_ranks lists like the fast path does."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in ("ring", "global_ranks") and isinstance(v, list) and all(
                    isinstance(x, int) and not isinstance(x, bool) for x in v):
                doc[k] = table.intern(",".join(str(x) for x in v))
            elif isinstance(v, (dict, list)):
                _intern_lists(v, table)
    elif isinstance(doc, list):
        for v in doc:
            if isinstance(v, (dict, list)):
                _intern_lists(v, table)
