"""A discrete-event simulator of a Baton cluster that drives the real control code.

Simulated workers each own a real ``engine.scheduler.Scheduler`` and ``BlockManager`` and a
``FakeModelRunner`` (the real batch preparation, deterministic fake tokens); a step takes the time
the cost model (``baton profile``) predicts for the batch the scheduler actually chose. The
simulated router runs the real lane classification, SLO-predictive admission, weighted lane
queues, capacity credits, placement (``router.placement``) and cluster prefix index, fed with the
same load reports and cache events the real workers send, at the times they would arrive.

Modules: ``clock`` (the event loop), ``config``, ``requests`` (workload in, records out), ``worker``,
``transfer`` (KV between a prefill and a decode worker), ``dispatch`` (the dispatcher's calls to the
workers), ``polls`` (outputs and load reports coming back), ``router``, ``stats``, ``simulator``
(wiring), ``cli`` (``python -m baton.perf.sim``), ``plan`` (``baton plan``'s search), ``validate``
(simulated vs a measured experiment report).
Deterministic: the same inputs give the same outputs; nothing reads the wall clock.
"""
