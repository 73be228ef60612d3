"""Adapters: find the 2L residual additions and the role of every parameter in a
model tinit did not build (a Hugging Face causal LM, a user's module, or tinit's own
``Transformer`` treated like any other model).

No I/O here and no import of transformers at module level: :mod:`.loaders` imports
it lazily, only for ``--hf``.
"""

from .roles import classify_roles
from .sites import BlockSites, SiteError, Sites, find_sites, parse_sites_spec

__all__ = ["BlockSites", "SiteError", "Sites", "classify_roles", "find_sites", "parse_sites_spec"]
