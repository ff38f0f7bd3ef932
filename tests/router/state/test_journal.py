"""Batch journal: submit/claim/complete/get, re-claiming from dead routers, tenant isolation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from router.state import RedisState
from router.state.journal import BatchJournal, ClaimedJob, JobIdConflict


def test_submit_claim_complete_get(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        j = BatchJournal(st)
        job_id = await j.submit({"tenant": "acme", "prompt": "hello", "max_tokens": 8})
        assert await j.pending_count() == 1
        s = await j.get(job_id, "acme")
        assert s is not None and s.status == "queued" and s.result is None and s.attempts == 0
        claimed = await j.claim("router-a", count=5, min_idle_ms=10_000)
        assert len(claimed) == 1 and isinstance(claimed[0], ClaimedJob)
        c = claimed[0]
        assert (c.job_id, c.tenant, c.attempt, c.reclaimed) == (job_id, "acme", 1, False)
        assert c.job == {"tenant": "acme", "prompt": "hello", "max_tokens": 8}
        assert await j.claim("router-b", count=5, min_idle_ms=10_000) == []  # delivered once
        await j.set_running(job_id, "router-a")
        assert (await j.get(job_id, "acme")).status == "running"
        await j.complete(job_id, c.entry_id, {"text": "world"}, ttl_s=60)
        s = await j.get(job_id, "acme")
        assert s is not None and s.status == "done" and s.result == {"text": "world"} and s.error is None
        assert await j.pending_count() == 0  # acknowledged entries leave the stream
        assert 0 < await st.client.pttl(st.key("batch", "job", job_id)) <= 60_000
        assert await j.claim("router-b", min_idle_ms=0) == []  # nothing left to re-claim
        await st.close()

    asyncio.run(main())


def test_tenant_isolation_and_validation(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        j = BatchJournal(st)
        job_id = await j.submit({"tenant": "acme", "x": 1})
        assert await j.get(job_id, "globex") is None  # someone else's job is indistinguishable
        assert await j.get("no-such-job", "acme") is None  # from a missing one
        assert (await j.get(job_id, "acme")) is not None
        with pytest.raises(ValueError):
            await j.submit({"x": 1})
        await st.close()

    asyncio.run(main())


def test_a_job_id_names_one_job_for_one_tenant(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        j = BatchJournal(st)
        job = {"tenant": "acme", "prompt": "first prompt"}
        assert await j.submit(job, job_id="bj-1") == "bj-1"
        assert await j.submit(dict(job), job_id="bj-1") == "bj-1"  # the same job again: queued once
        assert await j.pending_count() == 1
        for other in ({"tenant": "acme", "prompt": "another prompt"}, {"tenant": "globex", "prompt": "first prompt"}):
            with pytest.raises(JobIdConflict):  # was: accepted, and answered with bj-1's result
                await j.submit(other, job_id="bj-1")
        assert await j.pending_count() == 1
        await st.close()

    asyncio.run(main())


def test_dead_consumer_jobs_are_reclaimed(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        j = BatchJournal(st)
        ids = [await j.submit({"tenant": "t", "i": i}) for i in range(3)]
        # Idle times with seconds of slack: a loaded host can stall a step by a few hundred ms.
        first = await j.claim("router-a", count=2, min_idle_ms=2000)  # router-a then "dies"
        assert [c.job_id for c in first] == ids[:2]
        got = await j.claim("router-b", count=5, min_idle_ms=2000)
        assert [c.job_id for c in got] == ids[2:]  # too soon: a's jobs are not idle yet
        await asyncio.sleep(2.1)  # the behaviour under test: a's jobs idle past min_idle_ms
        again = await j.claim("router-b", count=5, min_idle_ms=2000)
        # a's two jobs move to b; b's own job, idle as well, is not handed to b a second time.
        assert sorted(c.job_id for c in again) == sorted(ids[:2])
        assert all(c.reclaimed and c.attempt == 2 for c in again)
        for c in again + got:
            await j.complete(c.job_id, c.entry_id, {"i": c.job["i"]})
        assert await j.pending_count() == 0
        assert [(await j.get(i, "t")).result for i in ids] == [{"i": 0}, {"i": 1}, {"i": 2}]
        await st.close()

    asyncio.run(main())


def test_restarted_router_reclaims_its_own_jobs_and_touch_protects(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        j = BatchJournal(st)
        a = await j.submit({"tenant": "t", "n": "a"})
        b = await j.submit({"tenant": "t", "n": "b"})
        claimed = await j.claim("router-0", count=2, min_idle_ms=1000)
        await asyncio.sleep(1.05)  # the behaviour under test: both jobs idle past min_idle_ms
        await j.touch("router-0", [c.entry_id for c in claimed if c.job_id == a])  # still working on a
        # Same consumer name after a restart (a fresh BatchJournal object): b is idle, a was touched
        # just now (a touch less than the 1 s before: a stall of up to ~1 s does not matter).
        j2 = BatchJournal(st)
        got = await j2.claim("router-0", count=5, min_idle_ms=1000)
        assert [c.job_id for c in got] == [b]
        await st.close()

    asyncio.run(main())


def test_fail_and_poison_jobs(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        j = BatchJournal(st, max_attempts=2)
        bad = await j.submit({"tenant": "t"})
        c = (await j.claim("r", min_idle_ms=0))[0]
        await j.fail(bad, c.entry_id, "model exploded")
        s = await j.get(bad, "t")
        assert s is not None and s.status == "failed" and s.error == "model exploded"
        poison = await j.submit({"tenant": "t"})
        assert len(await j.claim("r1", min_idle_ms=0)) == 1  # attempt 1, r1 dies
        assert len(await j.claim("r2", min_idle_ms=0)) == 1  # attempt 2, r2 dies
        assert await j.claim("r3", min_idle_ms=0) == []  # attempt 3 > max: failed, not delivered
        s = await j.get(poison, "t")
        assert s is not None and s.status == "failed" and "2 attempts" in (s.error or "")
        assert await j.pending_count() == 0
        await st.close()

    asyncio.run(main())


def test_concurrent_submits_of_one_id_queue_it_once(make_state: Callable[..., RedisState]) -> None:
    """The id check and the writes are one Lua script: no interleaving queues a job twice."""

    async def main() -> None:
        st = make_state()
        journals = [BatchJournal(st) for _ in range(8)]
        job = {"tenant": "acme", "prompt": "hello"}
        assert set(await asyncio.gather(*(j.submit(dict(job), job_id="j-1") for j in journals))) == {"j-1"}
        assert await journals[0].pending_count() == 1
        assert len(await journals[0].claim("router-a", count=10, min_idle_ms=10_000)) == 1
        await st.close()

    asyncio.run(main())


def test_cancel_a_queued_or_running_job_only_for_its_tenant(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        j = BatchJournal(st)
        queued = await j.submit({"tenant": "acme", "n": 1}, job_id="q")
        running = await j.submit({"tenant": "acme", "n": 2}, job_id="r")
        [_c_q, c_r] = await j.claim("router-a", count=2, min_idle_ms=10_000)
        assert await j.set_running(running, "router-a")
        assert await j.cancel(queued, "other") is None  # another tenant's: unknown to this one
        assert await j.cancel(queued, "acme") == "queued"
        assert await j.cancel(running, "acme") == "running"
        assert await j.statuses([queued, running, "nope"]) == {"q": "cancelled", "r": "cancelled", "nope": None}
        assert not await j.set_running(queued, "router-a")  # claimed before the cancel: not started
        assert await j.pending_count() == 0  # both entries left the stream
        assert await j.cancel(running, "acme") == "cancelled"  # ended: nothing more to cancel
        await j.finish_cancelled(running, c_r.entry_id, {"text": "par"})
        s = await j.get(running, "acme")
        assert s.status == "cancelled" and s.result == {"text": "par"}
        assert 0 < await st.client.pttl(st.key("batch", "job", running)) <= 86_400_000
        await st.close()

    asyncio.run(main())
