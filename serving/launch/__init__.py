"""Models started here: a model string resolved to weights and adapters (``registry``,
``adapters``), a vLLM server started, health-checked and stopped (``server``), the embedded
default (``embedded``), and how long each start took (``startlog``)."""
