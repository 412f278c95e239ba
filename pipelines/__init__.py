"""Evaluation pipelines in three layers: ``runtime`` (what every framework plugs into), one
package per framework (``generate``, ``comprehensiveness``, ``fanoutqa``, ``garage``, ``icat``,
``crux``, ``finetune``), and ``cli`` (the ``groundcover`` command line); beside them ``reports``,
``datasets`` and the Python API (``api``)."""
