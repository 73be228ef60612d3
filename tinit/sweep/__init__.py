"""``tinit sweep``: a command's grid as independent points (:mod:`tinit.experiments.points`)
run by an executor (a local process pool, or a SLURM job array through submitit) into
one run folder: a subfolder per point and the command's merged files.

:mod:`.worker` runs points and writes their folders (it is what a worker process or a
SLURM task imports), :mod:`.local` and :mod:`.slurm` are the executors, :mod:`.folder`
reads and gathers a sweep's run folder. Nothing here imports submitit unless the SLURM
executor is used.
"""
