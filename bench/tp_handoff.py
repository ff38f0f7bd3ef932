"""The KV handoff between tensor-parallel groups: rank to rank (``engine/parallel/direct_kv.py``)
against the interim path through rank 0 (``group_kv``: gather to rank 0, one 2-rank send,
broadcast), for N blocks from a prefill group of size P to a decode group of size D.

Both groups run in this process (rank 0 of each on a thread, their other ranks as local processes,
one torch thread each) on a random 8-layer Llama with 4 KV heads, so only the handoff is timed.

    python -m bench.tp_handoff --prefill-tp 1 --decode-tp 2 --blocks 128 [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.config import CacheConfig, EngineConfig
from engine.engine import LLMEngine
from engine.parallel.direct_kv import HandoffJoin, HandoffRecv, HandoffSend, RankHandoffs, run_handoff
from engine.parallel.group import host_store


@dataclass(frozen=True)
class HandoffTimes:
    prefill_tp: int
    decode_tp: int
    blocks: int
    mib: float  # every head of the blocks
    interim_ms: float  # medians over the repeats (a warm-up run left out)
    direct_ms: float
    load_average: float


def _model(root: Path, layers: int) -> Path:
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(root, safe_serialization=True)
    return root


def _both(f: Callable[[], Any], g: Callable[[], Any]) -> list[Any]:
    out: list[Any] = [None, None]

    def run(i: int, fn: Callable[[], Any]) -> None:
        out[i] = fn()

    threads = [threading.Thread(target=run, args=(0, f)), threading.Thread(target=run, args=(1, g))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def measure(prefill_tp: int, decode_tp: int, blocks: int, repeats: int = 5, layers: int = 8) -> HandoffTimes:
    with tempfile.TemporaryDirectory(prefix="baton-tp-handoff-") as tmp:
        model = str(_model(Path(tmp), layers))

        def engine(tp: int) -> LLMEngine:
            cache = CacheConfig(block_size=16, num_blocks=blocks + 8)
            return LLMEngine(
                EngineConfig(model=model, dtype="float32", tensor_parallel_size=tp, num_threads=1, cache=cache)
            )

        store = host_store()
        pre, dec = engine(prefill_tp), engine(decode_tp)
        try:
            return _time(pre, dec, store.port, prefill_tp, decode_tp, blocks, repeats)
        finally:
            pre.close()
            dec.close()


def _time(pre: LLMEngine, dec: LLMEngine, port: int, p: int, d: int, blocks: int, repeats: int) -> HandoffTimes:
    ids = tuple(range(blocks))
    ph = RankHandoffs(0, p, pre.runner.kv_cache, 4)
    dh = RankHandoffs(0, d, dec.runner.kv_cache, 4)
    _both(
        lambda: run_handoff(pre.ranks, ph, HandoffJoin("k", "127.0.0.1", port, "h", "prefill", p, d, 60)),
        lambda: run_handoff(dec.ranks, dh, HandoffJoin("k", "127.0.0.1", port, "h", "decode", p, d, 60)),
    )
    assert ph.wait_formed("k", 60) and dh.wait_formed("k", 60), "the handoff group did not form"
    timeout = datetime.timedelta(hours=1)

    def pair_rank(rank: int) -> dist.ProcessGroupGloo:
        client = dist.TCPStore(
            "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
        )
        return dist.ProcessGroupGloo(dist.PrefixStore("pair", client), rank, 2, timeout)

    pa, pb = _both(lambda: pair_rank(0), lambda: pair_rank(1))
    interim: list[float] = []
    direct: list[float] = []
    mib = 0.0
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        rows = pre.export_kv(list(ids))
        buf = torch.empty_like(rows)
        _both(lambda: pa.send([rows], 1, 0).wait(), lambda: pb.recv([buf], 0, 0).wait())
        dec.import_kv(list(ids), buf)
        interim.append(time.perf_counter() - t0)
        mib = rows.numel() * rows.element_size() / 2**20
        t0 = time.perf_counter()
        run_handoff(pre.ranks, ph, HandoffSend("k", ids, p, d))
        failed, _ = run_handoff(dec.ranks, dh, HandoffRecv("k", blocks, ids, 60))
        assert failed == 0, "a rank's receive failed"
        direct.append(time.perf_counter() - t0)
    return HandoffTimes(
        p,
        d,
        blocks,
        round(mib, 2),
        round(statistics.median(interim[1:]) * 1e3, 2),
        round(statistics.median(direct[1:]) * 1e3, 2),
        os.getloadavg()[0],
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill-tp", type=int, default=1)
    ap.add_argument("--decode-tp", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    t = measure(args.prefill_tp, args.decode_tp, args.blocks, args.repeats, args.layers)
    if args.json:
        print(json.dumps(asdict(t)))
    else:
        print(
            f"TP {t.prefill_tp} -> TP {t.decode_tp}, {t.blocks} blocks ({t.mib} MiB): interim {t.interim_ms} ms, "
            f"rank to rank {t.direct_ms} ms (load average {t.load_average:.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
