"""Bytes each rank puts on the wire between islands for one reduce_scatter, against the lower
bound; and, beside it, what carrying every island's partial of every block would cost
(reducing everything, then keeping one block: the all_reduce of the whole input).

    .venv/bin/python bench/islands_reduce_scatter.py [--mib 4] [--json]

Layouts of host islands (Gloo and the native transport inside) and of the stand-in
accelerator (standin/sccl). Bytes come from the relay world's links() (bytes sent and
received on every link, counted by the transport), as deltas around the op.

Lower bound for a rank of island I (n_I ranks) with output block b bytes, k islands: it must
receive the other k-1 islands' partials of its own block, (k-1) x b; its island must send its
partial of every block of the other islands' ranks, F_I x b (F_I: ranks outside I), which its
n_I ranks share: at least F_I x b / n_I each (rounded up to the island's cut).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

LAYOUTS = {
    "2+2 gloo/native": [("a", "gloo"), ("b", "hetobs"), ("a", "gloo"), ("b", "hetobs")],
    "2+1 gloo/native": [("a", "gloo"), ("a", "gloo"), ("b", "hetobs")],
    "1+3 gloo/native": [("a", "gloo"), ("b", "hetobs"), ("b", "hetobs"), ("b", "hetobs")],
    "2+2 gloo/standin": [("a", "gloo"), ("s", "sccl", "standin"), ("a", "gloo"), ("s", "sccl", "standin")],
    "1+2+1 cpu/standin/native": [("a", "gloo"), ("s", "sccl", "standin"), ("b", "hetobs"), ("s", "sccl", "standin")],
}


def rank_main(mib: float) -> None:
    import torch
    import torch.distributed as dist

    import hetobs  # noqa: F401  (registers hetobs_islands)

    device = os.environ.get("HETOBS_ISLAND_DEVICE", "cpu")
    if device == "standin":
        import hetobs_standin  # noqa: F401
    dist.init_process_group("hetobs_islands")
    pg = dist.distributed_c10d._get_default_group()  # the IslandsBackend itself (a Python ProcessGroup)
    world = pg._relay_world
    r, n = dist.get_rank(), dist.get_world_size()
    c = int(mib * (1 << 20)) // 4
    inp = torch.ones(n * c, device=device)
    out = torch.empty(c, device=device)

    def moved(fn) -> tuple[int, int]:
        before = {ln["peer"]: (ln["bytes_sent"], ln["bytes_recv"]) for ln in world.links()}
        fn()
        after = world.links()
        sent = sum(ln["bytes_sent"] - before.get(ln["peer"], (0, 0))[0] for ln in after)
        recv = sum(ln["bytes_recv"] - before.get(ln["peer"], (0, 0))[1] for ln in after)
        return sent, recv

    dist.reduce_scatter_tensor(out, inp)  # connections and buffers made before counting
    dist.all_reduce(inp)
    inp.fill_(1)
    rs = moved(lambda: dist.reduce_scatter_tensor(out, inp))
    ok = bool((out.cpu() == n).all())
    ar = moved(lambda: dist.all_reduce(inp))
    print("RESULT " + json.dumps({"rank": r, "rs_sent": rs[0], "rs_recv": rs[1], "ar_sent": ar[0], "ar_recv": ar[1],
                                  "ok": ok, "block": c * 4}), flush=True)
    dist.destroy_process_group()


def bounds(layout: list[tuple[str, ...]], block: int) -> list[tuple[int, int]]:
    """(sent, received) lower bounds per rank."""
    from hetobs.islands.partition import block_len

    islands: dict[str, list[int]] = {}
    for r, (isl, *_) in enumerate(layout):
        islands.setdefault(isl, []).append(r)
    k, n = len(islands), len(layout)
    out = []
    for isl, *_ in layout:
        members = len(islands[isl])
        foreign = (n - members) * block
        out.append((block_len(foreign, members), (k - 1) * block))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=4.0, help="output block per rank, MiB (default 4)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:
        rank_main(a.mib)
        return 0
    from hetobs.bench.local_job import result_of, run_local

    rows = []
    for name, layout in LAYOUTS.items():
        envs = [{"HETOBS_ISLAND": isl, "HETOBS_ISLAND_BACKEND": be, **({"HETOBS_ISLAND_DEVICE": d[0]} if d else {})}
                for isl, be, *d in layout]
        res = [result_of(p) for p in run_local([sys.executable, __file__, "--rank", "--mib", str(a.mib)], envs, 600)]
        bad = [x["error"] for x in res if "error" in x]
        if bad:
            print(f"{name}: {bad[0]}", file=sys.stderr)
            return 1
        for r, (x, (bs, br)) in enumerate(zip(res, bounds(layout, res[0]["block"]))):
            rows.append({"layout": name, "rank": r, "island": layout[r][0], "ok": x["ok"], "block_mib": a.mib,
                         "sent_mib": x["rs_sent"] / 2**20, "sent_bound_mib": bs / 2**20,
                         "recv_mib": x["rs_recv"] / 2**20, "recv_bound_mib": br / 2**20,
                         "all_reduce_sent_mib": x["ar_sent"] / 2**20})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"# reduce_scatter across islands, output block {a.mib:g} MiB per rank; MiB on the wire between islands "
          "per rank (relay world links(), frames included)")
    print("| layout | rank | island | sent | bound | received | bound | all_reduce of the input, sent |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for x in rows:
        print(f"| {x['layout']} | {x['rank']} | {x['island']} | {x['sent_mib']:.2f} | {x['sent_bound_mib']:.2f} | "
              f"{x['recv_mib']:.2f} | {x['recv_bound_mib']:.2f} | {x['all_reduce_sent_mib']:.2f} |"
              + ("" if x["ok"] else " WRONG RESULT"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
