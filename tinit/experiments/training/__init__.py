"""Training tinit's model to test the claims about training: the synthetic and file
data (:mod:`.data`), the training loop (:mod:`.train`), the learning-rate sweep
(:mod:`.lr_sweep`) and the primer's training claims (:mod:`.claims`)."""
