"""The trainer ranks of `rlckpt train`: each rank a Ray actor in a gloo group (trainer_rank), the handle that
calls them all at once (trainer_group), the controller's side of them (trainer_side), and the check that the
cluster holds them (capacity)."""
