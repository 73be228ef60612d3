"""Auditing a model tinit did not build: find its 2L residual additions and the role of
every parameter (the adapters: :mod:`.loaders` for Hugging Face configs and a user's
module, :mod:`.sites`, :mod:`.roles`), then measure it as built (:mod:`.audit`).

No I/O here and no import of transformers at module level: :mod:`.loaders` imports
it lazily, only for ``--hf``.
"""
