"""The ``kvpolicy demo`` workload: real models on both sides of a disaggregated run.

:mod:`.models` builds small Hugging Face models from fixed seeds and moves a prompt's KV cache
between the model and a :class:`~kvpolicy.transports.BlockPool`; :mod:`.disagg` runs a prefill and a
decode worker process, each with its own transceiver. Neither is part of the transfer layer
(:mod:`kvpolicy.transports`), which is what a serving process imports. Importing this package imports
nothing heavy; torch and transformers load with :mod:`.models`.
"""
