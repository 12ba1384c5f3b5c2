"""rlckpt: transactional checkpoints for RL post-training runs with a streaming data plane."""

__version__ = "0.1.0"
