"""How the CPU decode path groups a step's rows by KV length (pure Python: the cost model uses it too).

Decode attention on CPU gathers each row's KV blocks into one dense batch padded to its longest
row. With lengths spread out most of that is padding, so rows sorted by length are cut into groups
each padded to its own longest row, where the padding a cut saves exceeds a group's fixed cost
(docs/BENCHMARKS.md has the gain on spread-out lengths).
"""

from __future__ import annotations

import itertools

# A group's fixed cost (a gather and an SDPA call per layer, ~80 us) in rows x blocks of padding it
# must save: one row-block of SmolLM2's KV costs ~2.4 us to gather and attend on the 2-core CPU.
GROUP_OVERHEAD_BLOCKS = 32
MAX_GROUPS = 4


def length_groups(blocks: list[int], max_blocks: int) -> list[tuple[list[int], int]]:
    """Decode rows (their KV lengths in blocks) as (row indices, group width in blocks) groups.

    Greedy: the cut saving the most padded row-blocks, in any group, while it saves more than
    ``GROUP_OVERHEAD_BLOCKS``; at most ``MAX_GROUPS``. One group keeps the full table width
    ``max_blocks`` and every row in order (the ungrouped path).
    """
    order = sorted(range(len(blocks)), key=blocks.__getitem__)
    sizes = [blocks[i] for i in order]
    bounds = [0, len(sizes)]  # group g is sorted rows [bounds[g], bounds[g + 1])
    while len(bounds) - 1 < MAX_GROUPS:
        best, best_cut = GROUP_OVERHEAD_BLOCKS, None
        for start, end in itertools.pairwise(bounds):
            width = sizes[end - 1]
            for cut in range(start + 1, end):  # rows [start, cut) padded to sizes[cut - 1] instead
                saving = (cut - start) * (width - sizes[cut - 1])
                if saving > best:
                    best, best_cut = saving, cut
        if best_cut is None:
            break
        bounds = sorted([*bounds, best_cut])
    if len(bounds) == 2:
        return [(list(range(len(blocks))), max_blocks)]
    return [(order[s:e], sizes[e - 1]) for s, e in itertools.pairwise(bounds)]
