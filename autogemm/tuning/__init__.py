"""The search: a tune's options, Optuna studies over a family's space, the tuning loop, what it keeps,
its result and progress."""
