"""The search: Optuna studies over a family's space, the tuning loop, its result and progress."""
