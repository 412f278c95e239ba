"""Serving layer: the evaluator client every framework asks through, in this folder (``client``
over ``transport``, with its ``cache``, in-flight ``limits``, ``reasoning`` split from answers,
``parsing``, prompt ``templates``, what an endpoint serves: ``endpoints``, what a model is by
content: ``content``, and the ``scripted`` judge for exact-score tests); ``launch/``, models
started here (the model ``registry`` and trained ``adapters``, the vLLM ``server``, the
``embedded`` default, ``startlog``); ``cluster/``, models on Ray (a Serve LLM app of N replicas:
``serve_app``, its ``replica`` and ``lora`` loading; ``join``, joining a cluster and noticing it
gone).

Depends on nothing else of ours.
"""
