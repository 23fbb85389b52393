"""How the saved v1.0 example jobs here were made (run once; the files are frozen on purpose).

They are copies of the `hetobs.dump` 1.0 / `hetobs.rank` 1.0 format as docs/dump-schema.md
specifies it; tests/test_diagnosis_rules.py checks that they keep loading and keep giving
the same verdicts. Regenerating them is only right when the factory gains fields that a
1.x reader must accept anyway.

    python tests/data/dumps/v1.0/make.py
"""

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from diagnosis_factory import JobSpec  # noqa: E402


def write(spec: JobSpec, name: str) -> None:
    shutil.rmtree(HERE / name, ignore_errors=True)
    job_dir = spec.write(HERE)  # HERE is a HETOBS_DIR; the job id is the folder name
    for path in job_dir.rglob("*.json"):  # readable copies
        path.write_text(json.dumps(json.loads(path.read_text()), indent=1) + "\n")


healthy = JobSpec(4, job="healthy", incident="ondemand-1764500000000-0a1b", seconds=0.05)
for d in healthy.dumps.values():
    d["reason"] = "on_demand"
    d["cause"] = None
write(healthy, "healthy")

missing = JobSpec(4, job="missing-rank", incident="error-c0-s17")
missing.drop_dump(2)
closed = ("all_reduce seq 17 count 262144 float32 sum on comm 0 failed at rank {r}: rank 2 (host node1, pid 1002) "
          "closed its connection (while this rank was receiving from it)")
missing.fail_all({1: closed.format(r=1), 3: closed.format(r=3),
                  0: "all_reduce seq 17 count 262144 float32 sum on comm 0 failed at rank 0: aborted by rank 1 "
                     "(host node0, pid 1001): rank 2 (host node1, pid 1002) closed its connection"})
write(missing, "missing-rank")

mismatch = JobSpec(4, job="mismatch", seq=7, incident="error-c0-s7")
msg = ("all_reduce seq 7 count 262144 float32 sum on comm 0 failed at rank {r}: op mismatch on comm 0: deviating rank 1 "
       "(rank 1 called all_reduce seq 7 count 1024 float32 sum); ranks 0, 2, 3 called all_reduce seq 7 count 262144 "
       "float32 sum (this rank: {r})")
mismatch.fail_all({r: msg.format(r=r) for r in range(4)})
mismatch.dumps[1]["entries"][-1]["count"] = 1024
write(mismatch, "mismatch")
