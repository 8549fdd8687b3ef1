"""When a job stops: the stop rules on its validation curve (`rules`) and their projection forward (`forecast`),
which the supervisor's ETA and the planner share."""
