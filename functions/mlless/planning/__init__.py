"""`mlless plan`: LambdaML's analytic model of a job's time and cost by worker count, fitted on recorded runs.

* `steptime`: one step's seconds at P workers (local work, the close, hops, bytes over the link, a CPU roofline);
* `runs`: what a run directory tells the model (`RunMeasure`);
* `stoprule`: the samples after which the job's stop rule fires: the stop rule's projection on a run's curve;
* `model`: the fit (start-up, step, samples to stop by P) and its predictions with their cost;
* `cli`: the command, its pilot runs and its table.
"""
