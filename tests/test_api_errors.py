"""Bad input gets a clear ValueError before anything is sent.

Two ranks run the same list of bad calls (tests/rank_programs.py: prog_api_errors): each
must raise ValueError whose message names the problem, and leave its buffers untouched.
Then both run good collectives: had any bad call sent something, those would be out of
step (a mismatch or a hang), so their correct results show nothing went on the wire.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from _launch import run_python

if TYPE_CHECKING:
    from conftest import Launcher, LeakCheck

EXPECTED_CASES = {
    "complex64", "bool", "uint16", "object", "list", "non-contiguous", "fortran-order", "non-contiguous all_gather x",
    "read-only all_reduce", "read-only broadcast", "read-only reduce", "read-only all_gather out", "read-only recv",
    "all_gather out too small", "all_gather out too big", "reduce_scatter out wrong", "all_to_all uneven",
    "all_to_all out size", "all_gather dtype mismatch", "reduce_scatter dtype mismatch", "broadcast root=size",
    "broadcast root=-1", "broadcast root=0.0", "reduce root=size", "send to self", "send peer out of range",
    "recv from self", "recv peer negative", "avg on int32", "avg on uint8", "avg on int64 reduce",
    "avg on int8 reduce_scatter", "unknown op", "new_group duplicate ranks", "new_group empty",
    "new_group out of range",
    "torch non-contiguous", "torch transposed", "torch complex64", "torch bool", "torch meta device",
    "torch avg on int", "torch all_gather out size", "torch non-contiguous all_gather out",
}


def test_bad_input_raises_value_error(launcher: Launcher, leak_check: LeakCheck) -> None:
    job = launcher("api_errors", 2, {"torch": True}, transport="tcp", deadline=90.0)
    res = job.wait()
    results = res.check()
    problems = []
    for r in results:
        seen = {o["case"] for o in r["outcomes"]}
        missing = EXPECTED_CASES - seen
        assert not missing, f"rank {r['rank']} did not run cases {sorted(missing)}"
        for o in r["outcomes"]:
            if not o["ok"]:
                problems.append(f"rank {r['rank']} {o['case']}: {o.get('why')} "
                                f"(got {o.get('type')}: {o.get('msg')!r})")
        sec = r["sections"]["after_errors"]
        if sec["error"]:
            problems.append(f"rank {r['rank']}: good collectives after the bad calls raised "
                            f"{sec['error']['type']}: {sec['error']['msg']}")
        problems += [f"rank {r['rank']}: after the bad calls: {f}" for f in sec["failures"]]
        assert sec["checks"] >= 2
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("var,value", [("HETOBS_TIMEOUT", "soon"), ("HETOBS_TRANSPORT", "udp"),
                                       ("HETOBS_CONNECT_TIMEOUT", "-1"), ("HETOBS_JOB_ID", "a/b")])
def test_bad_setting_names_the_variable(core: Any, tmp_path: Path, var: str, value: str) -> None:
    """A bad HETOBS_* value fails init() with a ValueError naming the variable, before any
    connection is tried (MASTER_PORT points nowhere, and the error comes at once)."""
    code = (
        "import time, hetobs\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        "    hetobs.init(rank=0, world_size=2, master_addr='127.0.0.1', master_port=9)\n"
        "    emit({'error': None})\n"
        "except Exception as e:\n"
        "    emit({'error': type(e).__name__, 'is_value_error': isinstance(e, ValueError), 'msg': str(e),\n"
        "          'seconds': time.monotonic() - t0})\n"
    )
    env = {"HETOBS_TIMEOUT": "2", "HETOBS_CONNECT_TIMEOUT": "2", "HETOBS_DIR": str(tmp_path / "h"),
           "HETOBS_JOB_ID": "badsetting", var: value}
    out = run_python(code, env=env, timeout=30, workdir=tmp_path)
    assert out.result is not None, out.stderr
    assert out.result["error"] is not None, "init() accepted " + f"{var}={value!r}"
    assert out.result["is_value_error"], out.result
    assert var in out.result["msg"], out.result
    assert out.result["seconds"] < 1.0, out.result
