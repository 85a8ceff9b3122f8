"""orch's foundation: the few generic pieces every layer uses, below the environments.

* `orchlib.errors`: `OrchError` (bad input, one line for the user), the standard "unknown X; valid choices" error,
  and the one formatter that turns a pydantic `ValidationError` into located, one-line messages;
* `orchlib.registry`: `Registry`, the one helper behind every open set (environments, algorithms, filter
  strategies, trainer backends, step hooks, executors).

It imports nothing from the project, so `envs` (the leaf of the domain layers) can use it.
"""
