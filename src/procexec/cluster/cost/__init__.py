"""What generation costs: decoded tokens and GPU-hours, from a stated output-length and truncation model.

One model for two readers: ``procexec cost`` (the study's GPU-hour account, also
``benchmarks/gpu_hours.py``) and the workflow (each shard's SLURM
runtime from its share of the work).  Both decode at the rate of a bandwidth
model at the in-flight context, for the parallel layout the model runs
(tensor, data and expert parallel, speculative decoding).  Every number here is
an assumption, stated in ``docs/cluster.md`` with its source; a pilot's store
(``procexec cost --measured``) replaces the token volume and the rate.

One module per part of the account:

* ``catalog``: the GPU's and each model's numbers (``data/architecture.yaml``);
* ``throughput``: the parallel layout a model runs and its decode rate (the bandwidth model);
* ``output``: the output model, the tokens each phase decodes and at what context;
* ``runtime``: a job's start-up and a shard's SLURM runtime;
* ``measured``: what a smoke or pilot's store measured (tokens, rate, start-up, acceptance);
* ``projection``: one model's projection of the full study, stated or measured, and the paper-style baseline;
* ``report``: budgets against projections, and the table ``procexec cost`` prints.
"""
