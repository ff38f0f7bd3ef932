"""Reading a decode worker's outputs the way a router does: long polls until a request finishes."""

from __future__ import annotations

from decode_worker.worker import DecodeWorker
from engine.outputs import RequestOutput
from tests.waiting import wait_until


def outputs_until_finished(worker: DecodeWorker, origin: str, timeout_s: float = 10.0) -> list[RequestOutput]:
    """Every output ``worker`` returns to ``origin`` up to the first finished one (each long poll
    blocks up to 0.5 s for outputs, so no pause between them)."""
    outputs: list[RequestOutput] = []

    def finished() -> bool:
        outputs.extend(worker.poll(0.5, origin).outputs)
        return any(o.finished for o in outputs)

    wait_until(finished, timeout_s=timeout_s, interval_s=0, message=f"a finished output for {origin}")
    return outputs
