"""Models on a Ray cluster: N vLLM replicas behind one URL as a Serve LLM app (``serve_app``),
the replica class that counts what it answers (``replica``) and its engine, one process fewer on
a CPU node (``engine``), LoRA adapters read from paths on the replicas (``lora``), and joining a
cluster and noticing when it is gone (``join``); and a cluster job (``groundcover cluster``):
what runs where (``plan``), a model's memory from its config (``sizing``), the job on a Slurm
allocation or inside a running Ray cluster (``job``), models on an offline node
(``fetch``), and, for tests only, a local folder standing in for a model the job names
(``standin``)."""
