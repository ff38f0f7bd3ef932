"""Baton's OpenAI-compatible HTTP frontend.

``schemas`` shape-checks the OpenAI request bodies, ``body`` reads them (size-limited) and parses
them with those models (the rule for client-chosen request ids is ``router.request_ids``),
``responses`` builds the OpenAI response objects and stream chunks, ``app`` wires them to a
``RouterAPI`` (``create_app``), and ``server`` runs the app under uvicorn inside an existing event
loop (``HttpServer``) or in a background thread (``ThreadedHttpServer``). The frontend holds no
state of its own: everything a request needs (tenant, lane, admission) comes from the router.
"""
