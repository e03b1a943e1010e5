"""advisor: why is my PyTorch training slow, and what should I change first."""

__version__ = "0.1.0"
