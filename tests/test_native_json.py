"""The native writer leaves valid UTF-8 whatever a text holds, and cuts texts at character boundaries.

End to end: a rank whose host name is not UTF-8 (set in a private UTS namespace, as
root) writes its rank file and, when its peer dies, a dump; both must be valid UTF-8
JSON (the bad bytes become U+FFFD) and load without data problems. The rules
themselves through the writer's own functions (_core._json_escape / _utf8_prefix_len):
every invalid sequence, every cut of every multi-byte character.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from _inline import InlineJob
from hetobs.diagnosis import Options
from hetobs.diagnosis.loader import load_job

NEEDS_UTS = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                               reason="needs root and unshare for a private host name")

BODY = r"""
import os, signal
import numpy as np
import hetobs
comm = hetobs.init()
x = np.ones(1024, np.float32)
i = 0
try:
    while True:
        comm.all_reduce(x)
        i += 1
        if comm.rank == 1 and i == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # rank 0's op fails, naming rank 1 and its host
except hetobs.HetobsError as e:
    print("ERR", e)
"""

SET_HOST = ("import os, socket, sys; socket.sethostname(bytes.fromhex(sys.argv[1])); "
            "os.execv(sys.argv[2], sys.argv[2:])")
BAD_HOST = b"node-\xff-\xe2\x82"  # a lone byte that is never UTF-8, then half a euro sign


@NEEDS_UTS
def test_host_name_that_is_not_utf8_leaves_valid_json(tmp_path: Path) -> None:
    prefix = [["unshare", "--uts", sys.executable, "-c", SET_HOST, BAD_HOST.hex()]] * 2
    # HETOBS_DEBUG=ERROR: the rank's warnings quote the raw host name, which is no text for the launcher
    with InlineJob(BODY, 2, tmp_path, transport="tcp", prefix=prefix, env={"HETOBS_DEBUG": "ERROR"}) as job:
        runs = job.wait(90)
        # a PeerError whose text is valid (before: UnicodeDecodeError in place of the error)
        assert runs[0].returncode == 0 and "ERR" in runs[0].stdout, runs[0].stderr[-3000:]
        assert "node-\ufffd-\ufffd\ufffd" in runs[0].stdout, runs[0].stdout
        job_dir = job.dir / job.job_id
        files = [job_dir / "ranks" / "rank-0.json", *map(Path, glob.glob(str(job_dir / "incidents/*/rank-0.json")))]
        assert len(files) == 2, files
        for f in files:
            doc = json.loads(f.read_bytes().decode("utf-8"))  # strict: the writer escaped the bad bytes
            assert doc["host"] == "node-\ufffd-\ufffd\ufffd", doc["host"]
        loaded = load_job(Options(job_dir=job_dir, host_key="not-this-host"))
        assert 0 in loaded.dumps and not [p for p in loaded.problems if "UTF-8" in p.problem], loaded.problems


@pytest.mark.parametrize("raw,want", [
    (b"plain", "plain"),
    ("r\u00e9sum\u00e9 \u20ac \U0001F600".encode(), "r\u00e9sum\u00e9 \u20ac \U0001F600"),
    (b"\xff", "\ufffd"),
    (b"a\xc3", "a\ufffd"),  # cut 2-byte character
    (b"\xe2\x82", "\ufffd\ufffd"),  # cut 3-byte character
    (b"\xf0\x9f\x98", "\ufffd\ufffd\ufffd"),  # cut 4-byte character
    (b"\xc0\xaf", "\ufffd\ufffd"),  # overlong '/'
    (b"\xed\xa0\x80", "\ufffd\ufffd\ufffd"),  # a UTF-16 surrogate
    (b"\xf4\x90\x80\x80", "\ufffd\ufffd\ufffd\ufffd"),  # beyond U+10FFFF
    (b"\x80x", "\ufffdx"),  # a continuation byte alone
    (b'q"\\\n\x01\x7f', 'q"\\\n\x01\x7f'),
])
def test_escape_makes_valid_json(core: object, raw: bytes, want: str) -> None:
    out = core._json_escape(raw)  # type: ignore[attr-defined]
    assert json.loads(out.decode("utf-8")) == want


def test_truncation_never_cuts_a_character(core: object) -> None:
    text = "ab\u00e9\u20ac\U0001F600z".encode()  # 1, 1, 2, 3, 4, 1 bytes
    starts = {0, 1, 2, 4, 7, 11, 12}  # where each character starts (12: the end)
    for limit in range(len(text) + 2):
        n = core._utf8_prefix_len(text, limit)  # type: ignore[attr-defined]
        assert n <= limit and n in starts, (limit, n)
        assert n == max(s for s in starts if s <= limit), (limit, n)
        text[:n].decode("utf-8")
