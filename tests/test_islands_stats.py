"""The stats segment counts an islands job's relays: what `hetobs top` and the exporter read.

A hetobs_islands job crosses between islands through the host relay (op "relay" on the
native world communicator; its own record per crossing): host tensors as they are,
through host staging, or, from an island of the stand-in accelerator, through its device
copies. Each rank reports what its records say it relayed, then waits at a gate while
this process reads every rank's stats segment from outside, as `hetobs top` and the
exporter do: the relay slot of each rank's per-op counters holds the same calls and
bytes, and the exporter's /metrics families carry them with op="relay".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from _inline import InlineJob, wait_until
from hetobs import stats

pytest.importorskip("torch")

RELAYS = """
import json, os, time, torch, torch.distributed as dist
import hetobs
device = os.environ.get("HETOBS_ISLAND_DEVICE", "cpu")
if device == "standin":
    import hetobs_standin  # the stand-in accelerator and its library sccl
dist.init_process_group("hetobs_islands")
x = torch.ones(5000, device=device)
for _ in range(4):
    dist.all_reduce(x)
mine = [r for r in hetobs.records() if r["op"] == "relay"]
out = os.environ["READY"] + str(dist.get_rank())
with open(out + ".tmp", "w") as f:
    json.dump({"calls": len(mine), "bytes": sum(r["bytes"] for r in mine),
               "comms": sorted({r["comm_id"] for r in mine})}, f)
os.replace(out + ".tmp", out)  # whole or absent: the test reads it as soon as it appears
while not os.path.exists(os.environ["GO"]):
    time.sleep(0.01)
dist.destroy_process_group()
"""


@pytest.mark.slow
# Unequal islands relay host tensors as they are (stage none); equal ones with
# HETOBS_RELAY_STAGE=host through the host staging copies; an island of the stand-in
# accelerator through its device copies (stage device).
@pytest.mark.parametrize("layout, env", [([("a", "gloo"), ("a", "gloo"), ("b", "hetobs")], {}),
                                         ([("a", "gloo"), ("b", "gloo"), ("a", "gloo"), ("b", "gloo")],
                                          {"HETOBS_RELAY_STAGE": "host"}),
                                         ([("a", "gloo"), ("s", "sccl", "standin"), ("a", "gloo"),
                                           ("s", "sccl", "standin")], {})],
                         ids=["2+1, host tensors as they are", "2x2, staged", "2x2 gloo+standin"])
def test_relay_ops_are_in_every_ranks_stats_segment_and_the_exporter(layout: list[tuple[str, ...]],
                                                                      env: dict[str, str], tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from hetobs.exporters.prometheus import HetobsCollector
    from hetobs.exporters.source import ShmSource

    ready, go = str(tmp_path / "ready-"), str(tmp_path / "go")
    rank_env = {r: {"HETOBS_ISLAND": isl, "HETOBS_ISLAND_BACKEND": be} for r, (isl, be, *_) in enumerate(layout)}
    for r, (_, _, *device) in enumerate(layout):
        rank_env[r].update({"HETOBS_ISLAND_DEVICE": device[0]} if device else {})
    n = len(layout)
    with InlineJob(RELAYS, n, tmp_path, env={**env, "READY": ready, "GO": go}, rank_env=rank_env) as job:
        wait_until(lambda: all(os.path.exists(ready + str(r)) for r in range(n)), 120, "the ranks' relays")
        relayed = {r: json.loads(Path(ready + str(r)).read_text()) for r in range(n)}
        segments = {int(p.rsplit("-r", 1)[1]): stats.read_segment(p) for p in stats.segment_paths(job.job_id)}
        reg = CollectorRegistry()
        reg.register(HetobsCollector(ShmSource(job.job_id)))
        page = generate_latest(reg).decode()
        Path(go).touch()
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert sorted(segments) == list(range(n))
    samples = {(s.name, s.labels["rank"], s.labels["comm"]): s.value
               for f in text_string_to_metric_families(page) for s in f.samples if s.labels.get("op") == "relay"}
    for r, want in relayed.items():
        assert want["calls"] > 0 and len(want["comms"]) == 1, (r, want)
        [comm] = want["comms"]
        counted = {c.comm_id: c.ops.get("relay") for c in segments[r].comms}
        k = counted.get(comm)
        assert k is not None and (k.calls, k.bytes, k.errors) == (want["calls"], want["bytes"], 0), (r, want, counted)
        assert samples[("hetobs_collectives_total", str(r), str(comm))] == want["calls"], samples
        assert samples[("hetobs_collective_bytes_total", str(r), str(comm))] == want["bytes"], samples
