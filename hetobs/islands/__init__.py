"""Heterogeneous islands: one job across accelerators and collective libraries.

`dist.init_process_group("hetobs_islands")` (registered once torch.distributed is
imported, like the other hetobs backends) runs every collective hierarchically: the
vendor library inside each island (HETOBS_ISLAND, HETOBS_ISLAND_BACKEND), hetobs's
pipelined host relay between islands. docs/islands.md has the design and its numbers.

Modules: topology (who is in which island), partition (who relays what to whom),
vendor (the library inside an island), relay (the crossing), hierarchical (the
algorithms), backend (the torch ProcessGroup). Only `backend` and `vendor` need torch
at import.
"""
