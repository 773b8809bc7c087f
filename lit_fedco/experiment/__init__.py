"""Running a recipe: the run folder, checkpoints, sub-runs that survive faults, pre-training, the
runner."""
