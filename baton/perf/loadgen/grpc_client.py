"""The gRPC client of the load generator (``grpc.aio``, server-streaming ``Generate``).

Each ``GenerateResponse`` carries the token ids of its delta, so the ITL splits a message's gap
exactly over the tokens it brought. A status before any message is a rejection (its
``baton-error-code`` trailer is the reason); after one, a failure.
"""

from __future__ import annotations

import grpc

from baton.perf.loadgen.outgoing import Clock, Outgoing, ServerInfo, new_record, short
from baton.perf.loadgen.records import RequestRecord, chunk_arrived
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.grpc_gen.baton.v1 import generate_pb2_grpc as pb_grpc


def grpc_target(url: str) -> str:
    """``grpc://host:port`` or ``host:port`` -> ``host:port``."""
    return url.removeprefix("grpc://").rstrip("/")


class GrpcClient:
    def __init__(self, target: str, *, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self._channel = grpc.aio.insecure_channel(grpc_target(target))
        self._stub = pb_grpc.GenerationStub(self._channel)
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._timeout_s = timeout_s

    async def server_info(self) -> ServerInfo:
        info = await self._stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=self._metadata, timeout=30.0)
        return ServerInfo(
            model=info.id,
            max_model_len=info.max_model_len or None,
            vocab_size=info.vocab_size or None,
            lanes=tuple(info.lanes),
        )

    async def send(self, req: Outgoing, clock: Clock) -> RequestRecord:
        rec = new_record(req, clock)
        msg = pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=req.prompt_ids),
            lane=req.lane,
            sampling=pb.SamplingParameters(
                max_tokens=req.max_tokens, min_tokens=req.max_tokens, ignore_eos=True, temperature=0.0
            ),
        )
        call = self._stub.Generate(msg, metadata=self._metadata, timeout=self._timeout_s)
        last: float | None = None
        got_any = False
        try:
            async for resp in call:
                now = clock()
                got_any = True
                rec.served_lane = resp.lane or rec.served_lane
                if resp.token_ids:
                    last = chunk_arrived(rec, now, len(resp.token_ids), last)
                if resp.finished:
                    rec.end_s = now
                    if resp.HasField("usage"):
                        rec.output_tokens = resp.usage.completion_tokens
                        rec.cached_tokens = resp.usage.cached_tokens
                    if resp.finish_reason == "abort":
                        rec.status, rec.error_code = "error", "aborted"
        except grpc.aio.AioRpcError as e:
            code = e.code()
            rec.grpc_code = code.name
            rec.error_message = short(e.details() or "")
            for key, value in e.trailing_metadata() or ():
                if key == "baton-error-code":
                    rec.error_code = str(value)
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                rec.status = "timeout"
            else:
                rec.status = "error" if got_any else "rejected"
        if rec.end_s is None:
            rec.end_s = clock()
            if rec.status == "ok":  # the stream ended without a finished message
                rec.status, rec.error_type = "error", "stream_truncated"
        if rec.status == "ok" and rec.first_token_s is None:
            rec.first_token_s = rec.end_s
        return rec

    async def aclose(self) -> None:
        await self._channel.close()
