"""Pair formation delay: the first transfer between two agents when the decode side dialed at the
same time as the prefill side, and 3 s before it (its poll for the peer has backed off).

    python bench/results/pair_formation_latency_2026-11-26.py REPO_ROOT
(REPO_ROOT: a checkout to measure, e.g. a worktree of an older commit for the baseline.)"""
import sys, time, datetime
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
from kv_transfer.peer import StoreAddress
from tests.kv_transfer.test_agent import make_pair

master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=20))
store = StoreAddress("127.0.0.1", master.port)
for early in (0.0, 3.0):
    res = []
    for i in range(5):
        p, d, pp, dp, received, failed, acked = make_pair(store, inc=f"{early}-{i}")
        d.expect(pp, 1, "r1", [1, 2])
        time.sleep(early)
        t0 = time.monotonic()
        p.send_blocks(dp, 1, "r1", 0, [3, 4], chunk_index=0, last=True, first_token=7)
        received.wait(1)
        res.append(time.monotonic() - t0)
        p.close(); d.close()
    print(f"decode dialed {early:.0f}s before prefill: first transfer took {[round(x*1000) for x in res]} ms")
