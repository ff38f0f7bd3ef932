"""Baton launcher: keeps one ``python -m baton cluster`` Ray job running on this Ray head.

Shipped by the Helm chart (deploy/helm/baton) in the ConfigMap next to config.yaml.

``launcher.py run`` is the head pod's ``launcher`` sidecar (chart value ``launcher.mode: head``). It
waits for the Ray dashboard, attaches to this release's live Baton job or submits a new one through
the Ray Jobs API, and streams the job's logs to its own stdout (``kubectl logs <head> -c launcher``).
When the job ends it submits a new one, after a pause that doubles with each quick failure (10 s up
to 5 min; back to 10 s after a job that ran 10 minutes). It keeps running meanwhile rather than
exiting, so the head pod stays Ready and the Ray head Service keeps its endpoint. On SIGTERM it
stops the job (Ray sends it SIGTERM, waits ``RAY_JOB_STOP_WAIT_TIME_S`` while Baton drains, then
SIGKILL) and exits 0.

``launcher.py stop`` is the Ray head container's preStop hook, in both launcher modes: it stops the
release's live Baton jobs and waits for them to end, so Baton drains before the GCS goes away.

Only the standard library and Ray's job SDK are used.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

ADDRESS = os.environ.get("BATON_DASHBOARD_URL", "http://127.0.0.1:8265")
RELEASE = os.environ.get("BATON_RELEASE", "baton")
ENTRYPOINT = os.environ.get("BATON_ENTRYPOINT", "python -m baton cluster --config /etc/baton/config.yaml")
STOP_WAIT_S = int(os.environ.get("RAY_JOB_STOP_WAIT_TIME_S", "60"))
METADATA_KEY = "baton.release"
RETRY_FIRST_S, RETRY_MAX_S, HEALTHY_RUN_S = 10.0, 300.0, 600.0


def say(msg: str) -> None:
    print(f"[baton launcher] {msg}", file=sys.stderr, flush=True)


def connect(wait: bool = True):
    """A JobSubmissionClient for the local dashboard; waits for it to come up unless ``wait`` is
    false (then returns None when it is not reachable)."""
    from ray.job_submission import JobSubmissionClient

    while True:
        try:
            client = JobSubmissionClient(ADDRESS)
            client.list_jobs()
            return client
        except Exception as e:  # noqa: BLE001 - the dashboard is not up yet (any error of the client)
            if not wait:
                say(f"the Ray dashboard at {ADDRESS} is not reachable ({type(e).__name__})")
                return None
            say(f"waiting for the Ray dashboard at {ADDRESS} ({type(e).__name__})")
            time.sleep(3)


def live_jobs(client) -> list[str]:
    """Submission ids of this release's Baton jobs that have not ended."""
    return [
        j.submission_id
        for j in client.list_jobs()
        if (j.metadata or {}).get(METADATA_KEY) == RELEASE and j.submission_id and not j.status.is_terminal()
    ]


def stop_and_wait(client, ids: list[str], timeout_s: float) -> bool:
    """Ask Ray to stop the jobs, then wait until every one has ended; False on timeout."""
    for sid in ids:
        try:
            client.stop_job(sid)
            say(f"stopping {sid} (Ray sends SIGTERM, then SIGKILL after {STOP_WAIT_S}s)")
        except Exception as e:  # noqa: BLE001 - reported; the others are still stopped
            say(f"could not stop {sid}: {e}")
    deadline = time.monotonic() + timeout_s
    pending = list(ids)
    while pending and time.monotonic() < deadline:
        try:
            pending = [sid for sid in pending if not client.get_job_status(sid).is_terminal()]
        except Exception as e:  # noqa: BLE001 - reported; read again on the next round
            say(f"could not read the job status: {e}")
            return False
        if pending:
            time.sleep(1)
    return not pending


def submit(client) -> str:
    sid = client.submit_job(
        entrypoint=ENTRYPOINT,
        submission_id=f"{RELEASE}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}",
        metadata={METADATA_KEY: RELEASE},
        # The job supervisor reads it: how long Baton may drain after SIGTERM before SIGKILL.
        runtime_env={"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(STOP_WAIT_S)}},
    )
    say(f"submitted {sid}: {ENTRYPOINT}")
    return sid


async def follow(client, sid: str) -> int:
    """Stream the job's logs until it ends (returns 1) or SIGTERM/SIGINT arrives (stops it, returns 0)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def tail() -> None:
        try:
            async for chunk in client.tail_job_logs(sid):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        except Exception as e:  # noqa: BLE001 - the log stream broke; keep watching the status
            say(f"log stream ended: {e}")
        while not (await asyncio.to_thread(client.get_job_status, sid)).is_terminal():
            await asyncio.sleep(5)

    tail_task = asyncio.create_task(tail())
    stop_task = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({tail_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    if stop_task in done:
        say("SIGTERM: stopping the Baton job")
        await asyncio.to_thread(stop_and_wait, client, [sid], STOP_WAIT_S + 10)
        tail_task.cancel()
        return 0
    stop_task.cancel()
    info = await asyncio.to_thread(client.get_job_info, sid)
    say(f"job {sid} ended: {info.status} {info.message or ''}".rstrip())
    return 1


def run(max_jobs: int | None = None) -> int:
    """Keep a Baton job running until SIGTERM; ``max_jobs`` bounds the jobs (tests)."""
    client = connect()
    delay = RETRY_FIRST_S
    jobs = 0
    while max_jobs is None or jobs < max_jobs:
        jobs += 1
        live = live_jobs(client)
        if live:
            sid = live[0]
            say(f"following the running job {sid}")
        else:
            sid = submit(client)
        started = time.monotonic()
        if asyncio.run(follow(client, sid)) == 0:
            return 0
        # Baton is a server: any end of the job is one to restart from. Between jobs SIGTERM has
        # its default effect (nothing of ours is running to stop).
        if time.monotonic() - started >= HEALTHY_RUN_S:
            delay = RETRY_FIRST_S
        say(f"submitting a new job in {delay:.0f}s")
        time.sleep(delay)
        delay = min(delay * 2, RETRY_MAX_S)
    return 1


def stop() -> int:
    client = connect(wait=False)
    if client is None:
        return 0
    ids = live_jobs(client)
    if not ids:
        return 0
    ok = stop_and_wait(client, ids, STOP_WAIT_S + 10)
    say("the Baton job ended" if ok else "the Baton job is still running; Ray is going down anyway")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ("run", "stop"):
        print("usage: launcher.py run|stop", file=sys.stderr)
        return 2
    return run() if argv[1] == "run" else stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
