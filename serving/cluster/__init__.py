"""Models on a Ray cluster: N vLLM replicas behind one URL as a Serve LLM app (``serve_app``),
the replica class that counts what it answers (``replica``) and its engine, one process fewer on
a CPU node (``engine``), LoRA adapters read from paths on the replicas (``lora``), and joining a
cluster and noticing when it is gone (``join``)."""
