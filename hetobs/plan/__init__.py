"""Balance a mixed job: where time goes per rank (compute vs waiting in collectives) and the split that evens it.

- `split(B, seconds_per_sample, max_batch=None)`: data-parallel batch per rank, integers summing to B;
- `split_layers(layer_seconds, stages, stage_speed=None)`: layers per pipeline stage;
- `report_batch(n)`: tell `hetobs plan` this rank's batch;
- `account(ops)`, `plan_job(...)`: what `hetobs plan` runs (docs/islands.md, "Balance").
"""

from .accounting import OpTime, RankTime, Window, account
from .job import plan_job
from .model import PlanError, build_plan
from .report import read_batches, report_batch
from .split import LayerSplit, split, split_layers

__all__ = ["split", "split_layers", "LayerSplit", "report_batch", "read_batches", "account", "OpTime", "RankTime",
           "Window", "build_plan", "plan_job", "PlanError"]
