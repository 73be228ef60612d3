"""Measurements at initialization: the residual stream's variance (:mod:`.variance`),
gradient norms (:mod:`.grad_norms`), both against depth (:mod:`.depth_sweep`), the
attention logit scale (:mod:`.attention_scale`), parameter counts (:mod:`.params`),
the init catalogue's stds (:mod:`.inits`) and the primer's claims checked together
(:mod:`.check`). The probes that every one of them (and the audit and training) feeds
are in :mod:`.probes`."""
