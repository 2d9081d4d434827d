"""Evaluation of a trained model: motion metrics (:mod:`.metrics`), the evaluators a config declares
(:mod:`.evaluators`, ``config.evals``) and what a run writes for people to look at (:mod:`.artifacts`:
plots, BVH, video)."""
